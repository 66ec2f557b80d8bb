#!/usr/bin/env python3
"""Instruction data at skewed lengths (issue 18): real tokens per second of the
same model and samples with fixed padding to the longest row, dynamic padding,
dynamic padding + group_by_length, and packing, in one run.

    python3 tools/bench/packing.py [--samples 192] [--steps 6] [--max-len 2048] [--coretype X] [--ranks 2]

The sample file is made here: lengths drawn log-normally (median 180 tokens,
sigma 1.0) and clipped to [16, max_len], random token ids, the first 30% of
each sample an untrained prompt. The model is a small Llama (4 layers, 128
channels, 4 heads / 2 KV heads, vocabulary 2048), ZeRO-3 fp32 on --ranks CPU
ranks, micro-batch 4 units, no accumulation. Fixed padding is dynamic padding
with data.pad_to_multiple_of = max_len (every row max_len long), which is what
a trainer without dynamic padding does. "Real" tokens are those of samples;
the padding share is of the rows' positions (what the kernels compute). Each
mode trains --steps steps; the figure is the median over the steps after the
first of real tokens / step time (the trainer's metrics), shuffled order.
Targets: packing >= 90% of the computed positions real, real-token
throughput >= 3x fixed padding.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import coretype  # noqa: E402
import datafiles  # noqa: E402  (tools/)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "bin", "shardlm")
V = 2048


def make_samples(path, n, max_len, seed=0):
    rng = np.random.default_rng(seed)
    lens = np.clip(np.round(rng.lognormal(np.log(180), 1.0, size=n)), 16, max_len).astype(np.int64)
    tokens = rng.integers(0, V, size=int(lens.sum())).astype(np.int32)
    trained = np.zeros(len(tokens), np.uint8)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    for i in range(n):
        trained[off[i] + int(0.3 * lens[i]) + 1:off[i + 1]] = 1
    datafiles.write_samples(path, tokens, trained, off, V)
    return lens


MODES = (("fixed padding", {"pad_to_multiple_of": None}),
         ("dynamic padding", {}),
         ("dynamic + group_by_length", {"group_by_length": True}),
         ("packing", {"packing": True}))


def run_mode(tmp, data, a, name, extra, env):
    data_cfg = {"train": data, "max_seq_length": a.max_len, "shuffle": True}
    for k, v in extra.items():
        data_cfg[k] = a.max_len if v is None else v
    metrics = os.path.join(tmp, name.replace(" ", "_").replace("+", "") + ".jsonl")
    cfg = {"model": {"type": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "ffn_dim": 352,
                     "vocab_size": V, "n_positions": a.max_len, "tie_word_embeddings": False},
           "data": data_cfg,
           "train": {"steps": a.steps, "eval_every": 0, "sample_tokens": 0, "metrics": metrics},
           "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 3}}
    path = os.path.join(tmp, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run(["mpirun", "-np", str(a.ranks), "--oversubscribe", BIN, "train", path, "--quiet"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"packing bench: {name} failed:\n{r.stdout[-2000:]}")
    rows = [json.loads(x) for x in open(metrics) if x.strip()]
    steps = [x for x in rows if "step" in x and "loss" in x][1:]
    return {"real_per_s": statistics.median(x["tokens_per_s"] for x in steps),
            "trained_per_s": statistics.median(x["trained_tokens_per_s"] for x in steps),
            "padding": sum(x["padding"] * 1.0 for x in steps) / len(steps),
            "ms": statistics.median(x["ms"] for x in steps),
            "data": [x for x in rows if "data" in x][0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=192)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--coretype", default=None)
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    core = coretype.apply(env, a.coretype)
    with tempfile.TemporaryDirectory(prefix="shardlm-packing.") as tmp:
        data = os.path.join(tmp, "samples.h5")
        lens = make_samples(data, a.samples, a.max_len)
        print(f"cpu: {coretype.describe()}, OPENBLAS_CORETYPE={core}; {a.ranks} ranks, ZeRO-3 fp32, micro-batch 4")
        print(f"samples: {a.samples}, lengths {lens.min()}..{lens.max()} (median {int(np.median(lens))}, mean "
              f"{lens.mean():.0f}), max_seq_length {a.max_len}; Llama 4 x 128, vocab {V}; {a.steps} steps per mode")
        res = {}
        for name, extra in MODES:
            res[name] = run_mode(tmp, data, a, name, extra, env)
            r = res[name]
            print(f"  {name:28s} {r['real_per_s']:9.0f} real tok/s  {r['trained_per_s']:9.0f} trained tok/s  "
                  f"padding {100 * r['padding']:5.1f}%  {r['ms']:8.0f} ms/step", flush=True)
        base = res["fixed padding"]["real_per_s"]
        print("real-token throughput relative to fixed padding:")
        for name, _ in MODES:
            print(f"  {name:28s} {res[name]['real_per_s'] / base:5.2f}x")
        real = 1 - res["packing"]["padding"]
        speed = res["packing"]["real_per_s"] / base
        print(f"packing: {100 * real:.1f}% of the computed positions real (target >= 90%: "
              f"{'met' if real >= 0.9 else 'NOT met'}); {speed:.2f}x fixed padding (target >= 3x: "
              f"{'met' if speed >= 3 else 'NOT met'})")


if __name__ == "__main__":
    main()
