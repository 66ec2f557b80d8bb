#!/usr/bin/env python3
"""zero_overlap — ZeRO stage 3 on 2 ranks against 1, and how much of the
communication hides behind compute. A benchmark, not a test.

    python3 tools/bench/zero_overlap.py [--shape 124M|small] [--steps 4] [--coretype X]

For one model and one global batch it runs bin/shardlm four times:
  N=1                      the whole machine's threads in one rank
  N=2                      half the threads per rank, ZeRO stage 3
  N=2 compute-only         SHARDLM_BENCH=compute-only: every collective a no-op
  N=2 comm-only            SHARDLM_BENCH=comm-only: the passes walked without kernels
and prints the median step times (first step dropped), the N=2/N=1 speed-up,
and the hidden fraction of communication:
    hidden = 1 - (step - compute alone) / communication alone
Environment for all runs: OMP_WAIT_POLICY=passive, OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS set per rank; OPENBLAS_CORETYPE as tools/bench/coretype.py
resolves --coretype X: a core type the CPU supports, auto (the default when the
environment sets none) or none (unset).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile

import coretype

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "bin", "shardlm")
SHAPES = {  # n_layer, n_head, n_embd, seq_len, vocab
    "124M": (12, 12, 768, 256, 50257),
    "small": (4, 4, 256, 128, 8192),
}


def write_tokens(path, n, vocab):
    import random
    rng = random.Random(1234)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))


def run(tmp, cfg_path, ranks, threads, steps, mode, env_base):
    metrics = os.path.join(tmp, f"m_{ranks}_{mode}.jsonl")
    env = dict(env_base, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if mode != "full":
        env["SHARDLM_BENCH"] = mode
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", BIN, "train", cfg_path,
           "--quiet", "--set", f"train.metrics={metrics}", "--set", f"train.steps={steps}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"shardlm failed ({' '.join(cmd)}):\n{out.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(metrics) if '"ms"' in l]
    times = [r["ms"] for r in rows[1:]] or [rows[0]["ms"]]
    traffic = rows[-1].get("bytes_allgather", 0) + rows[-1].get("bytes_reduce_scatter", 0)
    return statistics.median(times), traffic


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="124M", choices=SHAPES)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="threads for the whole machine")
    ap.add_argument("--coretype", default=None, help="OPENBLAS_CORETYPE: a core type the CPU supports, auto, none")
    args = ap.parse_args()

    L, NH, C, T, V = SHAPES[args.shape]
    env = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    core = coretype.apply(env, args.coretype)
    print(f"cpu: {coretype.describe()}, OPENBLAS_CORETYPE={core}")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "tokens.bin")
        write_tokens(data, (T + 1) * args.batch * (args.steps + 2) + 1, V)
        cfg = {
            "model": {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T, "vocab_size": V},
            "data": {"train": data, "seq_len": T},
            "train": {"steps": args.steps},
            "train_batch_size": args.batch,
            "train_micro_batch_size_per_gpu": args.batch // 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
            "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 2 * 12 * C * C + 1,
                                  "stage3_param_persistence_threshold": 100000},
        }
        cfg_path = os.path.join(tmp, "cfg.json")
        json.dump(cfg, open(cfg_path, "w"))
        t1, _ = run(tmp, cfg_path, 1, args.threads, args.steps, "full", env)
        half = max(1, args.threads // 2)
        t2, traffic = run(tmp, cfg_path, 2, half, args.steps, "full", env)
        tcomp, _ = run(tmp, cfg_path, 2, half, args.steps, "compute-only", env)
        tcomm, _ = run(tmp, cfg_path, 2, half, args.steps, "comm-only", env)
    hidden = 1.0 - max(0.0, t2 - tcomp) / tcomm if tcomm > 0 else float("nan")
    print(f"shape {args.shape}: {L} layers, {C} channels, T={T}, vocab {V}; global batch {args.batch}; "
          f"ZeRO stage 3; OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'run':28s} {'ms/step':>10s}")
    print(f"{'N=1 (' + str(args.threads) + ' threads)':28s} {t1:10.1f}")
    print(f"{'N=2 (' + str(half) + ' thread(s) each)':28s} {t2:10.1f}")
    print(f"{'N=2 compute alone':28s} {tcomp:10.1f}")
    print(f"{'N=2 communication alone':28s} {tcomm:10.1f}   ({traffic / 2**20:.1f} MiB sent per rank per step)")
    print(f"speed-up N=2 over N=1: {t1 / t2:.2f}x")
    print(f"communication hidden behind compute: {100 * hidden:.0f}%  (target >= 80%)")


if __name__ == "__main__":
    main()
