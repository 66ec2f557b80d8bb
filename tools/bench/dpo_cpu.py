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

    /usr/bin/python3 tools/bench/dpo_cpu.py --lora SHAPE STEPS REPS [BINARY ...]

The LoRA step (the reference: the base with the adapters off, in every step)
against the SFT LoRA step: build/bench/cfg_dpo_SHAPE_{sft,dpo}_lora.json run
at train.steps STEPS, each step's CPU time read from /proc (user + sys of the
process between two lines of its metrics JSONL) beside its wall time (the
JSONL's ms); the first step is left out as warm-up, medians over the rest and
over REPS runs of each, SFT and DPO in turn, the load average before and
after. Each BINARY (default bin/shardlm) runs the DPO config too, in the same
turn: an A/B of two builds.
"""
import os
import resource
import statistics
import json
import subprocess
import sys
import time

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


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_steps(binary, cfg, steps, env, tag):
    """[(CPU s, wall ms)] of each step of `BINARY train CFG` at train.steps STEPS: the process's user + sys ticks
    (/proc/PID/stat) read whenever a line lands in its metrics JSONL (polled every 20 ms)."""
    metrics = os.path.join(ROOT, "build", "bench", f"dpo_cpu_{tag}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    p = subprocess.Popen([binary, "train", cfg, "--set", f"train.steps={steps}", "--set", f"train.metrics={metrics}",
                          "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tick = os.sysconf("SC_CLK_TCK")
    marks, seen = [], 0
    while True:
        done = p.poll() is not None
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError):
            cpu = None
        lines = 0
        if os.path.exists(metrics):
            with open(metrics) as f:
                lines = sum(1 for ln in f if '"ms"' in ln)
        if lines > seen and cpu is not None:
            marks.append(cpu)
            seen = lines
        if done:
            break
        time.sleep(0.02)
    if p.returncode != 0:
        raise SystemExit(f"error: {binary} train {cfg} failed (rc {p.returncode})")
    with open(metrics) as f:
        ms = [json.loads(ln)["ms"] for ln in f if '"ms"' in ln]
    if len(marks) != len(ms):
        raise SystemExit(f"error: {len(ms)} steps but {len(marks)} CPU readings: a step was shorter than the poll")
    return [(marks[i] - marks[i - 1], ms[i]) for i in range(1, len(ms))]  # the first step: warm-up


def main_lora(argv):
    shape, steps, reps = argv[0], int(argv[1]), int(argv[2])
    binaries = argv[3:] or [os.path.join(ROOT, "bin", "shardlm")]
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"cpu: {cpu}; {shape} LoRA, {steps} steps a run (the first left out), {reps} times; load average "
          f"{load_average()}", flush=True)
    runs = [("sft_lora", binaries[0])] + [("dpo_lora", b) for b in binaries]
    got = {}
    for rep in range(reps):
        for i, (kind, binary) in enumerate(runs):
            cfg = os.path.join(ROOT, "build", "bench", f"cfg_dpo_{shape}_{kind}.json")
            if not os.path.exists(cfg):
                raise SystemExit(f"error: {cfg} missing: run bash tools/bench/dpo.sh --shape {shape} first")
            st = run_steps(binary, cfg, steps, env, f"{shape}_{kind}{i}")
            got.setdefault(i, []).extend(st)
            print(f"{kind} {binary} rep {rep}: CPU ms " + " ".join(f"{c * 1e3:.0f}" for c, _ in st) + "; wall ms "
                  + " ".join(f"{w:.0f}" for _, w in st) + f"; load average {load_average()}", flush=True)
    med = {i: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for i, v in got.items()}
    for i, (kind, binary) in enumerate(runs):
        print(f"{kind} {binary}: CPU {med[i][0] * 1e3:.0f} ms, wall {med[i][1]:.0f} ms a step (medians of "
              f"{len(got[i])} steps)" + (f"; DPO / SFT: CPU {med[i][0] / med[0][0]:.3f}, wall {med[i][1] / med[0][1]:.3f}"
                                         f" (target <= 1.6)" if i else ""), flush=True)
    print(f"load average after: {load_average()}  [{cpu}]")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--lora":
        if len(sys.argv) < 5:
            raise SystemExit(__doc__)
        return main_lora(sys.argv[2:])
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
