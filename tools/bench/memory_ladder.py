#!/usr/bin/env python3
"""memory_ladder — per-rank device memory of GPT-2 124M at N=4 down the ladder
users climb on large models, planned and measured. A benchmark, not a test.

    python3 tools/bench/memory_ladder.py [--ranks 4] [--micro 2] [--seq 256]

Each rung trains one step with mpirun -np N and reads the exact planned and
peak bytes of every buffer class from the metrics file's last line:
  fp32 stage 0 -> fp16 stage 2 -> fp16 stage 3 -> + activation checkpointing
  (every block) -> + optimizer offload (fp32 master, Adam, fp32 gradients in
  pinned host memory).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "bin", "shardlm")
RUNGS = [
    ("fp32, stage 0", ["zero_optimization.stage=0"]),
    ("fp16, stage 2", ["fp16.enabled=true", "zero_optimization.stage=2"]),
    ("fp16, stage 3", ["fp16.enabled=true", "zero_optimization.stage=3"]),
    ("+ activation checkpointing", ["fp16.enabled=true", "zero_optimization.stage=3",
                                    "activation_checkpointing.enabled=true", "activation_checkpointing.interval=1"]),
    ("+ optimizer offload", ["fp16.enabled=true", "zero_optimization.stage=3",
                             "activation_checkpointing.enabled=true", "activation_checkpointing.interval=1",
                             "zero_optimization.offload_optimizer.device=cpu"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory() as tmp:
        n = (args.seq + 1) * args.micro * args.ranks * 4
        data = os.path.join(tmp, "tokens.bin")
        with open(data, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack(f"<{n}H", *((i * 7919) % 50257 for i in range(n))))
        cfg = {
            "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257},
            "data": {"train": data, "seq_len": args.seq},
            "train": {"steps": 1},
            "train_micro_batch_size_per_gpu": args.micro,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage3_prefetch_bucket_size": 2 * 7.1e6,
                                  "stage3_param_persistence_threshold": 1e5},
        }
        cfg_path = os.path.join(tmp, "cfg.json")
        json.dump(cfg, open(cfg_path, "w"))
        print(f"GPT-2 124M, {args.ranks} ranks, micro-batch {args.micro} x {args.seq} tokens; bytes per rank")
        print(f"{'rung':30s} {'device planned':>15s} {'device peak':>13s} {'pinned host':>13s}  largest device items")
        for name, sets in RUNGS:
            metrics = os.path.join(tmp, "m.jsonl")
            cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", "--bind-to", "none", BIN, "train", cfg_path,
                   "--quiet", "--set", f"train.metrics={metrics}"]
            for s in sets:
                cmd += ["--set", s]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{name}: shardlm failed:\n{out.stderr[-1500:]}")
            mem = json.loads(open(metrics).read().strip().splitlines()[-1])["memory"]
            dev_plan = sum(v["planned"] for v in mem.values() if v["space"] == "device")
            dev_peak = sum(v["peak"] for v in mem.values() if v["space"] == "device")
            pinned = sum(v["planned"] for v in mem.values() if v["space"] == "pinned host")
            top = sorted(((v["planned"], k) for k, v in mem.items() if v["space"] == "device"), reverse=True)[:3]
            tops = ", ".join(f"{k} {b / 2**20:.0f}" for b, k in top)
            print(f"{name:30s} {dev_plan / 2**20:12.1f} MiB {dev_peak / 2**20:10.1f} MiB {pinned / 2**20:10.1f} MiB  {tops}")


if __name__ == "__main__":
    main()
