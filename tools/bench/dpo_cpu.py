#!/usr/bin/env python3
"""dpo_cpu — shardlm's DPO full fine-tune step against its SFT step in CPU
seconds (user + sys of `shardlm train`), a measure the machine's other load
barely moves, unlike wall-clock medians.

    /usr/bin/python3 tools/bench/dpo_cpu.py SHAPE LO HI REPS [LOGITS_ROWS ...]

Runs build/bench/cfg_dpo_SHAPE_{sft,dpo}_full.json (written by
`bash tools/bench/dpo.sh --shape SHAPE`, which also makes the data and the
DPO run's reference file) at train.steps HI and LO; a step's CPU time is the
difference over HI - LO, so start-up and the reference pass cancel. REPS
times each, medians. Each LOGITS_ROWS ("" = the trainer's own) sets
SHARDLM_LOGITS_ROWS: the rows of logits a chunk of the LM head (the number of
rows puts the head in one chunk, where DPO computes nothing again).
Environment as dpo.sh's: 2 threads, OMP_WAIT_POLICY=passive.
"""
import os
import resource
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cpu_seconds(cfg, steps, rows, env):
    e = dict(env)
    if rows:
        e["SHARDLM_LOGITS_ROWS"] = rows
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([os.path.join(ROOT, "bin", "shardlm"), "train", cfg, "--set", f"train.steps={steps}", "--quiet"],
                   env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    shape, lo, hi, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"cpu: {cpu}; {shape}, steps {hi} - {lo}, {reps} times")
    for rows in sys.argv[5:] or [""]:
        got = {}
        for rep in range(reps):
            for kind in ("sft_full", "dpo_full"):
                cfg = os.path.join(ROOT, "build", "bench", f"cfg_dpo_{shape}_{kind}.json")
                if not os.path.exists(cfg):
                    raise SystemExit(f"error: {cfg} missing: run bash tools/bench/dpo.sh --shape {shape} first")
                d = (cpu_seconds(cfg, hi, rows, env) - cpu_seconds(cfg, lo, rows, env)) / (hi - lo)
                got.setdefault(kind, []).append(d)
                print(f"logits rows {rows or 'default'} {kind} {rep}: {d * 1e3:.1f} CPU ms a step", flush=True)
        s, d = statistics.median(got["sft_full"]), statistics.median(got["dpo_full"])
        print(f"logits rows {rows or 'default'}: SFT {s * 1e3:.1f}, DPO {d * 1e3:.1f} CPU ms a step (medians); "
              f"DPO / SFT {d / s:.3f} (target <= 1.1)  [{cpu}]", flush=True)


if __name__ == "__main__":
    sys.exit(main())
