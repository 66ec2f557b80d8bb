#!/usr/bin/env python3
"""nvme_step — the training step with offload_optimizer "nvme" against the same
step with offload_optimizer "cpu" (target: nvme <= 1.3x cpu), in one run.

Driven by tools/bench/nvme.sh (the second figure). bin/shardlm train on the
12-layer Llama shape of tools/bench/train_llama.py (L 12, C 768, 12 heads over 4
KV heads, F 2048, vocabulary 32000, T 512: 125M parameters, 1.5 GB of master, m
and v), fp32, 1 rank, ZeRO stage 1, micro-batch --micro x gradient accumulation
--accum (16), a synthetic token shard; the two sides alternate --rounds times,
each run --steps steps of which the first is dropped; the step time is the median
of the metrics' "ms" over the kept steps of every round. The nvme side's file is
under --dir (the disk measured), O_DIRECT and io_uring where available (its log
line says which).

Prints the CPU, the disk, both medians, the ratio, the nvme run's bytes read and
written per step, and the exact commands.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from datafiles import write_shard  # noqa: E402

MODEL = {"type": "llama", "n_layer": 12, "n_head": 12, "n_kv_head": 4, "n_embd": 768, "ffn_dim": 2048,
         "n_positions": 512, "vocab_size": 32000, "tie_word_embeddings": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench", "nvme"))
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--accum", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    out = os.path.join(ROOT, "build", "bench", "nvme_step")
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, "train.bin")
    T, B = args.seq, args.micro * args.accum
    need = B * T * args.steps + 1
    if not os.path.exists(data) or os.path.getsize(data) < 1024 + 2 * need:
        write_shard(data, np.random.default_rng(0).integers(0, MODEL["vocab_size"], size=need))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    times = {"cpu": [], "nvme": []}
    nvme = None
    commands = {}
    for _ in range(args.rounds):
        for dev in ("cpu", "nvme"):
            metrics = os.path.join(out, f"{dev}.jsonl")
            offload = {"device": dev}
            if dev == "nvme":
                offload["nvme_path"] = args.dir
            cfg = {"model": dict(MODEL, n_positions=T),
                   "data": {"train": data, "seq_len": T, "shuffle": False},
                   "train": {"steps": args.steps, "eval_every": 0, "sample_tokens": 0, "metrics": metrics,
                             "threads": args.threads},
                   "train_batch_size": B, "train_micro_batch_size_per_gpu": args.micro,
                   "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                   "zero_optimization": {"stage": 1, "offload_optimizer": offload}}
            path = os.path.join(out, f"{dev}.json")
            with open(path, "w") as f:
                json.dump(cfg, f, indent=1)
            cmd = [os.path.join(ROOT, "bin", "shardlm"), "train", path]
            commands[dev] = " ".join(cmd)
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with open(os.path.join(out, f"{dev}.log"), "w") as f:
                f.write(r.stdout)
            if r.returncode != 0:
                sys.exit(f"nvme_step: the {dev} run failed (exit {r.returncode}); see {out}/{dev}.log")
            rows = [json.loads(line) for line in open(metrics)]
            times[dev] += [row["ms"] for row in rows if "loss" in row][1:]
            for row in rows:
                nvme = row.get("nvme", nvme)
            for line in r.stdout.splitlines():
                if "offload_optimizer nvme:" in line:
                    print("  " + line.strip())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"12-layer Llama (125M parameters, fp32), 1 rank, stage 1, micro-batch {args.micro} x accumulation "
          f"{args.accum} x T {T}, {args.threads} threads, median of {len(times['cpu'])} steps per side")
    print(f"  offload_optimizer cpu : {med['cpu']:9.1f} ms per step")
    print(f"  offload_optimizer nvme: {med['nvme']:9.1f} ms per step  ({nvme['file_bytes'] / 2**30:.2f} GiB file, "
          f"{nvme['host_bytes'] / 2**20:.0f} MiB of buffers, {'O_DIRECT' if nvme['direct'] else 'buffered'})")
    print(f"  ratio nvme / cpu: {med['nvme'] / med['cpu']:.3f} (target <= 1.3)")
    for dev, c in commands.items():
        print(f"  {dev}: {c}")


if __name__ == "__main__":
    main()
