#!/usr/bin/env python3
"""PyTorch's AdamW step on the CPU, timed: the reference for tools/bench/adamw.sh.

torch.optim.AdamW(foreach=True) and (foreach=False) on N fp32 parameters
(split into --tensors equal tensors), gradients set once, with the same
hyper-parameters as adamw_bench (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight
decay 0.1) and torch.set_num_threads(--threads). The first --warmup steps
(state allocation) are not timed. Prints one JSON line per variant:
  {"variant": "foreach", "ms": [...], "median_ms": M, "best_ms": B, "other_cpu": F}
other_cpu: the share of the machine's CPU time that other processes used
while this variant was timed (from /proc/stat), to spot a noisy neighbour.

Run with Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import gc
import json
import os
import resource
import statistics
import time

import torch


def cpu_busy_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return sum(fields[:3]) + sum(fields[5:8])


def own_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000_000, help="parameters (default 1e8)")
    ap.add_argument("--tensors", type=int, default=1, help="split into this many equal tensors (default 1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = [args.n // args.tensors + (1 if i < args.n % args.tensors else 0) for i in range(args.tensors)]
    params = []
    for size in sizes:
        p = torch.nn.Parameter(torch.empty(size).uniform_(-0.02, 0.02))
        p.grad = torch.empty(size).uniform_(-1e-3, 1e-3)
        params.append(p)

    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    for foreach in (True, False):
        opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=foreach)
        for _ in range(args.warmup):
            opt.step()
        ms = []
        j0, c0, w0 = cpu_busy_jiffies(), own_cpu_seconds(), time.monotonic()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            opt.step()
            ms.append((time.perf_counter() - t0) * 1e3)
        wall = time.monotonic() - w0
        other = ((cpu_busy_jiffies() - j0) / hz - (own_cpu_seconds() - c0)) / (wall * ncpu)
        print(json.dumps({
            "variant": "foreach" if foreach else "loop",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "n": args.n,
            "tensors": args.tensors,
            "ms": [round(x, 2) for x in ms],
            "median_ms": statistics.median(ms),
            "best_ms": min(ms),
            "other_cpu": max(0.0, other),
        }), flush=True)
        del opt
        gc.collect()


if __name__ == "__main__":
    main()
