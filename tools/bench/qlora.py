#!/usr/bin/env python3
"""QLoRA against LoRA on the CPU (tools/bench/qlora.sh): the same model, data and
adapters, one run each, in one benchmark run.

  python3 tools/bench/qlora.py [--model DIR] [--ranks N] [--steps S] [--warmup W] [--seq T] [--micro B] [--r R]

Model: a Hugging Face directory (default build/models/SmolLM2-135M-Instruct,
the suite's real model: 135 M parameters, 538 MB of fp32). Both runs: bf16,
ZeRO stage 3 at N ranks (default 2), LoRA r 16 on every linear layer,
micro-batch B of T tokens of random ids, S steps of which the first W are not
counted. The QLoRA run adds quantization {load_in_4bit, nf4, double
quantization, bfloat16 compute}. Prints the CPU model, each run's median step
ms and the ratio (target: QLoRA <= 1.3 x LoRA), and each rank's peak host
memory (VmHWM) after the parameters were read (QLoRA: the 4-bit shards, and
while reading only the rank's own blocks of one tensor; tests/t_qlora.py
bounds it). Outputs in build/bench/qlora/.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from datafiles import write_shard  # noqa: E402

BIN = os.path.join(ROOT, "bin", "shardlm")
OUT = os.path.join(ROOT, "build", "bench", "qlora")


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run(name, args, quantized):
    cfg = {
        "model": {"from_pretrained": args.model},
        "data": {"train": os.path.join(OUT, "tokens.bin"), "seq_len": args.seq},
        "train": {"steps": args.steps, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(OUT, name + ".jsonl")},
        "train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3},
        "lora": {"r": args.r, "alpha": 2 * args.r, "target_modules": "all-linear"},
    }
    if quantized:
        cfg["quantization"] = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                               "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    if os.path.exists(cfg["train"]["metrics"]):
        os.remove(cfg["train"]["metrics"])
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpirun", "-q", "-np", str(args.ranks), BIN, "train", path]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = r.stdout + r.stderr
    with open(os.path.join(OUT, name + ".log"), "w") as f:
        f.write(log)
    if r.returncode != 0:
        sys.exit(f"{name}: exit {r.returncode}: {log[-800:]}")
    rows = [json.loads(line) for line in open(cfg["train"]["metrics"]) if line.strip()]
    ms = [row["ms"] for row in rows if "ms" in row][args.warmup:]
    peak = re.search(r"peak host memory per rank after the parameters' init \(KiB\): ([\d ]+)", log)
    return statistics.median(ms), min(ms), [int(x) for x in peak.group(1).split()] if peak else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--r", type=int, default=16)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    import random
    rng = random.Random(1)
    write_shard(os.path.join(OUT, "tokens.bin"), [rng.randrange(vocab) for _ in range(200 * args.seq + 1)])
    print(f"CPU: {cpu_name()}; {args.ranks} ranks x {args.threads} thread(s); model {args.model}", flush=True)
    lora = run("lora", args, False)
    qlora = run("qlora", args, True)
    for name, (med, best, peak) in (("LoRA bf16", lora), ("QLoRA nf4+dq", qlora)):
        print(f"{name:14s} step {med:9.1f} ms median ({best:.1f} best); peak host memory per rank after the "
              f"parameters' init: {' '.join(f'{k / 1024:.0f} MiB' for k in peak)}")
    ratio = qlora[0] / lora[0]
    print(f"QLoRA / LoRA step time: {ratio:.3f} (target <= 1.3: {'met' if ratio <= 1.3 else 'not met'})")
    json.dump({"cpu": cpu_name(), "lora_ms": lora[0], "qlora_ms": qlora[0], "ratio": ratio,
               "lora_peak_kib": lora[2], "qlora_peak_kib": qlora[2]}, open(os.path.join(OUT, "qlora.json"), "w"))


if __name__ == "__main__":
    main()
