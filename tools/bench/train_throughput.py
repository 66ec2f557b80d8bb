#!/usr/bin/env python3
"""train_throughput — shardlm vs PyTorch training throughput, side by side.

Driven by tools/bench/train_throughput.sh (which builds bin/shardlm and the
sgemm probe first). For each shape it runs, with one environment for both:

  * bin/shardlm train <config> --quiet, metrics to a JSONL file (one line per
    step with "ms" and "tokens_per_s");
  * tools/bench/torch_gpt2.py, the same model, batch, sequence, vocabulary
    (shardlm's padded one) and threads, in torch;

drops the first --warmup steps of each, and compares median (and best) step
times. MFU = tokens/s * model FLOPs per token (what `shardlm plan --json`
prints for the config: src/model.c model_flops_per_token) / sgemm peak, the
peak measured in this run by build/bench/sgemm_peak with the same OpenBLAS,
core type and thread count.

The machine may be shared: each run also reports how busy the CPUs were with
other processes while it ran ("other" = busy jiffies in /proc/stat not spent
by the benchmarked process, over wall time x CPUs). Numbers taken with
other > ~10% are contended; rerun or use --rounds.

The measuring machinery here (add_common_args, bench_env, Shape, compare and
the helpers they call) also drives tools/bench/train_llama.py, which puts
shardlm's Llama beside Hugging Face transformers' LlamaForCausalLM.
"""
import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import coretype

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "build", "bench")
SHARDLM = os.environ.get("BENCH_SHARDLM") or os.path.join(ROOT, "bin", "shardlm")
SGEMM = os.path.join(OUT, "sgemm_peak")
TORCH_PY = os.path.join(ROOT, "tools", "bench", "torch_gpt2.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

SHAPES = {
    # name: (n_layer, n_head, n_embd, seq_len, batch, vocab)
    "small": (4, 4, 256, 128, 8, 8192),
    "124M": (12, 12, 768, 256, 4, 50257),
}
# shardlm should train at least this many times as fast as the reference on every shape.
RATIO_TARGET = 1.5


# OpenBLAS core names (driver/others/dynamic.c), to spot one in shardlm's log.
CORE_RE = (r"\b(Prescott|Core2|Penryn|Dunnington|Nehalem|Sandybridge|Haswell|SkylakeX|Cooperlake|SapphireRapids|"
           r"Zen|Barcelona|Bulldozer|Piledriver|Steamroller|Excavator|Atom|Katmai|Coppermine|Northwood|Banias|"
           r"Opteron|Athlon|Nano)\b")


def padded_vocab(v, align=128):
    """The padded vocabulary (MODEL_VOCAB_ALIGN, src/core/options.h) (a multiple of 128): what the reference's embedding and head get."""
    return (v + align - 1) // align * align


@dataclass
class Shape:
    """One row of a comparison: shardlm's "model" config section and the reference's command line for the
    same model (everything but the run-length and thread arguments, which compare adds)."""
    name: str
    label: str  # the row's name in the table
    model: dict  # shardlm config "model" section
    seq_len: int
    batch: int
    steps: int
    ref_args: list
    flops_per_token: float = 0.0  # filled from `shardlm plan --json`
    cfg_path: str = ""
    extra: dict = field(default_factory=dict)  # more fields for the JSON results
    config: dict = field(default_factory=dict)  # more top-level sections of shardlm's config (e.g. "lora")


@dataclass
class Reference:
    """The other side of the comparison: a script in the torch_gpt2.py protocol (JSON lines, then a line
    "summary {...}") run by an interpreter."""
    key: str  # prefix of its JSON keys: "torch", "hf"
    python: str
    script: str = TORCH_PY
    label: str = ""  # its name in the output (default: key)


def cpu_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


class QuietWaiter:
    """Before each measurement, waits (up to per_wait seconds, total_cap in all)
    for the CPUs to be idle: busy < threshold over a 2 s window."""

    def __init__(self, per_wait, total_cap, threshold=0.10):
        self.per_wait, self.left, self.threshold = per_wait, total_cap, threshold

    def __call__(self, what):
        if self.per_wait <= 0 or self.left <= 0:
            return
        hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        t0 = time.monotonic()
        while True:
            j0 = cpu_busy_jiffies()
            time.sleep(2.0)
            busy = (cpu_busy_jiffies() - j0) / hz / (2.0 * ncpu)
            waited = time.monotonic() - t0
            if busy < self.threshold:
                break
            if waited >= min(self.per_wait, self.left):
                print(f"  (CPUs still {100 * busy:.0f}% busy with other processes before {what}; measuring anyway)")
                break
        self.left -= waited
        if waited > 2.5:
            print(f"  (waited {waited:.0f} s for other processes to quiet down before {what})")


def run_measured(cmd, env, log_path, poll=None, budget=0.0, min_lines=0):
    """Runs cmd, returns (rc, wall_s, own_cpu_s, other_frac). If poll (a metrics
    path) is given, stops the process with SIGTERM once it has >= min_lines
    step lines and budget seconds have passed (shardlm has no time budget)."""
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    j0, t0 = cpu_busy_jiffies(), time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        stopped = False
        while p.poll() is None:
            time.sleep(0.2)
            if poll and budget > 0 and not stopped and time.monotonic() - t0 > budget:
                if count_steps(poll) >= min_lines:
                    p.send_signal(signal.SIGTERM)
                    stopped = True
        rc = p.wait()
    wall = time.monotonic() - t0
    j1 = cpu_busy_jiffies()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    other = max(0.0, (j1 - j0) / hz - own) / (wall * ncpu) if wall > 0 else 0.0
    return (0 if stopped else rc), wall, own, other, stopped


def count_steps(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if '"ms"' in line)
    except OSError:
        return 0


def write_shard(path, n_tokens, vocab, seed):
    import numpy as np
    if os.path.exists(path) and os.path.getsize(path) == 1024 + 2 * n_tokens:
        return
    rng = np.random.default_rng(seed)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, n_tokens
    toks = rng.integers(0, vocab, size=n_tokens, dtype=np.uint16)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())
    os.replace(tmp, path)


def sgemm_peak(env, threads):
    out = subprocess.run([SGEMM, "--threads", str(threads), "--sizes", "1024,2048,3072", "--reps", "3"],
                         env=env, capture_output=True, text=True, check=True).stdout
    info = dict(line.split(" ", 1) for line in out.strip().splitlines() if not line.startswith("size "))
    sizes = re.findall(r"size (\d+) gflops ([\d.]+)", out)
    return float(info["peak_gflops"]), info["corename"], info.get("config", ""), sizes


def stats(ms, warmup):
    kept = ms[warmup:] if len(ms) > warmup else ms[-1:]
    return statistics.median(kept), min(kept), len(kept)


def write_config(shape, threads):
    """Writes shardlm's config for SHAPE (a synthetic token shard of its vocabulary as data) and returns
    the model FLOPs per token that `shardlm plan --json` computes for it."""
    V = shape.model["vocab_size"]
    T, B = shape.seq_len, shape.batch
    data = os.path.join(OUT, f"tokens_v{V}.bin")
    write_shard(data, max(1 << 20, (shape.steps + 2) * B * (T + 1) * 2), V, 1234)
    cfg = {
        "model": shape.model,
        "data": {"train": data, "val": None, "seq_len": T},
        "train": {"steps": shape.steps, "eval_every": 0, "sample_tokens": 0, "threads": threads},
        "train_micro_batch_size_per_gpu": B,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 0},
    }
    cfg.update(shape.config)
    shape.cfg_path = os.path.join(OUT, f"cfg_{shape.name}.json")
    with open(shape.cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    out = subprocess.run([SHARDLM, "plan", shape.cfg_path, "--target", "cpu", "--json"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"shardlm plan {shape.cfg_path} failed (rc {out.returncode}):\n{out.stderr[-2000:]}")
    shape.flops_per_token = float(json.loads(out.stdout.strip().splitlines()[-1])["flops_per_token"])


def run_shardlm(shape, threads, warmup, budget, env, tag):
    metrics = os.path.join(OUT, f"metrics_{shape.name}_{tag}.jsonl")
    log = os.path.join(OUT, f"shardlm_{shape.name}_{tag}.log")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [SHARDLM, "train", shape.cfg_path, "--set", f"train.metrics={metrics}", "--quiet"]
    rc, wall, own, other, stopped = run_measured(cmd, env, log, poll=metrics, budget=budget,
                                                 min_lines=warmup + 2)
    ms = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                d = json.loads(line)
                if "ms" in d:
                    ms.append(d["ms"])
    if rc != 0 or not ms:
        sys.stderr.write(open(log).read()[-3000:])
        raise SystemExit(f"shardlm failed on shape {shape.name} (rc {rc}); log {log}")
    # The kernel shardlm ran, if its log names one (it warns "OpenBLAS chose its generic 'Prescott'
    # kernels"); otherwise it ran what sgemm_peak ran (same library, same environment).
    with open(log) as f:
        m = re.search(CORE_RE, f.read())
    return {"ms": ms, "wall": wall, "other": other, "cpu_util": own / (wall * threads), "stopped": stopped,
            "log": log, "metrics": metrics, "kernel_warning": m.group(1) if m else None}


def run_reference(ref, shape, threads, warmup, budget, env, tag):
    log = os.path.join(OUT, f"{ref.key}_{shape.name}_{tag}.log")
    cmd = [ref.python, ref.script] + [str(a) for a in shape.ref_args] + [
        "--seq-len", str(shape.seq_len), "--batch", str(shape.batch), "--threads", str(threads),
        "--steps", str(shape.steps), "--warmup", str(warmup), "--min-steps", str(warmup + 2),
        "--time-budget", str(budget)]
    rc, wall, own, other, _ = run_measured(cmd, env, log)
    summary = None
    with open(log) as f:
        for line in f:
            if line.startswith("summary "):
                summary = json.loads(line[len("summary "):])
    if rc != 0 or summary is None:
        sys.stderr.write(open(log).read()[-3000:])
        raise SystemExit(f"{ref.key} failed on shape {shape.name} (rc {rc}); log {log}")
    return {"ms": summary["ms"], "wall": wall, "other": other, "cpu_util": own / (wall * threads),
            "summary": summary, "corename": summary["corename"], "log": log}


def measure(args, shape, ref, env, tag, who, core):
    """One measured run on SHAPE of shardlm (REF None) or of the reference REF: the run's dict (run_shardlm's or
    run_reference's) with median_ms, best_ms and n (steps after the warm-up) added. Prints its line, WHO
    naming the run, and a warning where the run's OpenBLAS core is not CORE (sgemm_peak's)."""
    if ref is None:
        res = run_shardlm(shape, args.threads, args.warmup, args.budget, env, tag)
    else:
        res = run_reference(ref, shape, args.threads, args.warmup, args.budget, env, tag)
    res["median_ms"], res["best_ms"], res["n"] = stats(res["ms"], args.warmup)
    print(f"  {who}: median {res['median_ms']:9.1f} ms  best {res['best_ms']:9.1f} ms  over {res['n']} steps "
          f"(+{args.warmup} warm-up)  cpu {100 * res['cpu_util']:3.0f}% of {args.threads} threads  "
          f"other procs {100 * res['other']:3.0f}%" + ("  [stopped at budget]" if res.get("stopped") else ""),
          flush=True)
    name = (ref.label or ref.key) if ref else "shardlm"
    if ref is not None and res["corename"] != core:
        print(f"  warning: {name}'s OpenBLAS core is {res['corename']}, sgemm_peak's {core}")
    if ref is None and res["kernel_warning"]:
        if res["kernel_warning"] != core:
            print(f"  warning: shardlm reports OpenBLAS core {res['kernel_warning']}, sgemm_peak's {core}")
        print(f"  (shardlm's log names OpenBLAS core {res['kernel_warning']})")
    return res


def add_common_args(ap, default_json, default_steps):
    """The options every training-throughput comparison takes."""
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "0")) or os.cpu_count())
    ap.add_argument("--coretype", default=None,
                    help="OPENBLAS_CORETYPE for both sides: a core type the CPU's flags allow, auto (the best "
                         "of them), or none (unset: OpenBLAS's own detection); default: the environment's "
                         "OPENBLAS_CORETYPE, else auto")
    ap.add_argument("--isa", default="native", choices=("native", "avx2"),
                    help="avx2: measure as on an AVX2-only CPU (the .sh builds shardlm for x86-64-v3 into "
                         "build/avx2/; torch's ATen and oneDNN kernels capped at AVX2; core types needing "
                         "AVX-512 refused)")
    ap.add_argument("--steps", type=int, default=default_steps,
                    help=f"steps per run, warm-up included (default {default_steps})")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget", type=float, default=120.0,
                    help="seconds per side per shape; a run past it stops after warm-up + 2 steps (default 120)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate shardlm/reference this many times; best "
                                                          "median wins")
    ap.add_argument("--wait-quiet", type=float, default=20.0,
                    help="before each run wait up to S seconds for other processes to leave the CPUs idle "
                         "(default 20; 0 = don't)")
    ap.add_argument("--wait-quiet-total", type=float, default=90.0, help="cap on all such waits (default 90 s)")
    ap.add_argument("--json", default=os.path.join(OUT, default_json))
    ap.add_argument("--check-only", action="store_true",
                    help="check the arguments and the core type against the CPU, run nothing")


def bench_env(args):
    """(environment for every side, OPENBLAS_CORETYPE as set, the CPU's one-line description). A core type
    the CPU cannot run ends the program (coretype.apply)."""
    env = dict(os.environ)
    n = str(args.threads)
    env.update(OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, OMP_WAIT_POLICY="passive")
    coretype_env = coretype.apply(env, args.coretype, args.isa)
    cpu = coretype.describe(coretype.restrict(coretype.read_cpu(), args.isa))
    if args.isa == "avx2":
        env.update(ATEN_CPU_CAPABILITY="avx2", DNNL_MAX_CPU_ISA="AVX2")
    return env, coretype_env, cpu


def compare(args, shapes, ref, env, coretype_env, cpu, mfu_targets=None):
    """Measures every shape with shardlm and the reference REF (alternating, --rounds times), the sgemm peak
    before and after, prints the table and the figures, and writes args.json. MFU_TARGETS: {shape name:
    fraction of the sgemm peak shardlm should reach}. Returns the results (one dict per shape)."""
    mfu_targets = mfu_targets or {}
    n = str(args.threads)
    R, RL = ref.key, ref.label or ref.key
    print(f"cpu: {cpu}; shardlm: {os.path.relpath(SHARDLM, ROOT)}; {RL}: {os.path.relpath(ref.python, ROOT)} "
          f"{os.path.relpath(ref.script, ROOT)}")
    print(f"env: OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} OMP_WAIT_POLICY=passive "
          f"OPENBLAS_CORETYPE={coretype_env}  (same for shardlm, {RL} and sgemm_peak)")
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])} on {os.cpu_count()} CPUs")
    for shape in shapes:
        write_config(shape, args.threads)
    quiet = QuietWaiter(args.wait_quiet, args.wait_quiet_total)
    quiet("sgemm_peak")
    peak0, core, blascfg, sizes = sgemm_peak(env, args.threads)
    print(f"sgemm_peak: {', '.join(f'{s}^3 {g}' for s, g in sizes)} GFLOP/s -> {peak0:.1f}; "
          f"openblas_get_corename() = {core}  [{cpu}]")
    print(f"  {blascfg.strip()}")

    results = []
    for shape in shapes:
        best = {"shardlm": None, R: None}
        for r in range(args.rounds):
            tag = f"r{r}"
            for side in ("shardlm", R):
                who = RL if side == R else side
                quiet(f"{who} {shape.name}")
                res = measure(args, shape, ref if side == R else None, env, tag,
                              f"{shape.name:5s} round {r} {who:7s}", core)
                if best[side] is None or res["median_ms"] < best[side]["median_ms"]:
                    best[side] = res
        tok = shape.batch * shape.seq_len
        s, t = best["shardlm"], best[R]
        m = shape.model
        summary = t["summary"]
        results.append(dict({
            "shape": shape.name, "n_layer": m["n_layer"], "n_head": m["n_head"], "n_embd": m["n_embd"],
            "seq_len": shape.seq_len, "batch": shape.batch, "vocab": m["vocab_size"],
            "padded_vocab": padded_vocab(m["vocab_size"]), "flops_per_token": shape.flops_per_token,
            "tokens_per_step": tok,
            "shardlm_tok_s": tok / s["median_ms"] * 1e3, "shardlm_best_tok_s": tok / s["best_ms"] * 1e3,
            f"{R}_tok_s": tok / t["median_ms"] * 1e3, f"{R}_best_tok_s": tok / t["best_ms"] * 1e3,
            "shardlm_ms": s["ms"], f"{R}_ms": t["ms"], "shardlm_other": s["other"], f"{R}_other": t["other"],
            "torch_version": summary["torch"], f"{R}_corename": t["corename"],
            "shardlm_corename": s["kernel_warning"] or core,
        }, **shape.extra, **{k: summary[k] for k in ("transformers", "attn") if k in summary}))

    quiet("sgemm_peak")
    peak1, _, _, sizes1 = sgemm_peak(env, args.threads)
    peak = max(peak0, peak1)
    print(f"sgemm_peak again after the runs: {peak1:.1f} GFLOP/s; MFU uses the higher, {peak:.1f}  [{cpu}]")

    print()
    print(f"{cpu}: threads {n}, OPENBLAS_CORETYPE={coretype_env}, OpenBLAS kernel {core}; "
          f"tok/s = median (best) over steps after {args.warmup} warm-up; "
          f"ratio = shardlm/{RL} of medians (of bests); MFU from medians")
    hdr = (f"{'shape':<34} {'shardlm tok/s':>20} {RL + ' tok/s':>20} {'ratio':>14} {'shardlm MFU':>11} "
           f"{RL + ' MFU':>9} {'sgemm GF/s':>10}")
    print(hdr)
    print("-" * len(hdr))
    for shape, r in zip(shapes, results):
        sm = r["shardlm_tok_s"] * r["flops_per_token"] / (peak * 1e9)
        tm = r[f"{R}_tok_s"] * r["flops_per_token"] / (peak * 1e9)
        r.update(shardlm_mfu=sm, shardlm_best_mfu=r["shardlm_best_tok_s"] * r["flops_per_token"] / (peak * 1e9),
                 **{f"{R}_mfu": tm}, ratio=r["shardlm_tok_s"] / r[f"{R}_tok_s"],
                 ratio_best=r["shardlm_best_tok_s"] / r[f"{R}_best_tok_s"], sgemm_peak_gflops=peak)
        print(f"{shape.label:<34} {r['shardlm_tok_s']:>9.0f} ({r['shardlm_best_tok_s']:>8.0f}) "
              f"{r[f'{R}_tok_s']:>9.0f} ({r[f'{R}_best_tok_s']:>8.0f}) {r['ratio']:>5.2f}x ({r['ratio_best']:.2f}x) "
              f"{100 * sm:>10.1f}% {100 * tm:>8.1f}% {peak:>10.1f}")
    print()
    for r in results:
        print(f"{r['shape']}: shardlm {r['shardlm_tok_s']:.0f} tok/s, {RL} {r[f'{R}_tok_s']:.0f} tok/s, "
              f"ratio {r['ratio']:.2f}x, shardlm {100 * r['shardlm_mfu']:.1f}% (best step "
              f"{100 * r['shardlm_best_mfu']:.1f}%) of sgemm peak "
              f"{peak:.1f} GFLOP/s  [{cpu}, {core}, {n} threads]")
    if min(peak0, peak1) < 0.85 * peak:
        print(f"note: sgemm peak moved from {peak0:.1f} to {peak1:.1f} GFLOP/s during the run: the machine's speed "
              f"varied (shared host or other processes); compare ratios from a quiet run")
    contended = [r["shape"] for r in results if max(r["shardlm_other"], r[f"{R}_other"]) > 0.10]
    if contended:
        print(f"note: other processes used >10% of the CPUs during {', '.join(contended)}; numbers are contended")
    verdict = all(r["ratio"] >= RATIO_TARGET for r in results)
    print(f"target shardlm >= {RATIO_TARGET}x {RL} on every shape: {'met' if verdict else 'NOT met'}")
    for r in results:
        if r["shape"] in mfu_targets:
            goal = mfu_targets[r["shape"]]
            print(f"target shardlm >= {100 * goal:.0f}% of the sgemm peak on {r['shape']}: "
                  f"{'met' if r['shardlm_mfu'] >= goal else 'NOT met'} ({100 * r['shardlm_mfu']:.1f}%, best step "
                  f"{100 * r['shardlm_best_mfu']:.1f}%)")
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "isa": args.isa, "threads": args.threads, "coretype_env": coretype_env, "corename": core,
                   "reference": {"name": RL, "python": ref.python, "script": ref.script}, "sgemm_peak_gflops": peak, "sgemm_sizes": sizes + sizes1, "results": results}, f, indent=1)
    print(f"results: {os.path.relpath(args.json, ROOT)}")
    return results


def gpt2_shape(name, L, NH, C, T, B, V, steps):
    model = {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T, "vocab_size": V}
    ref_args = ["--n-layer", L, "--n-head", NH, "--n-embd", C, "--vocab", padded_vocab(V), "--real-vocab", V]
    return Shape(name, f"{name} L{L} C{C} B{B} T{T} V{padded_vocab(V)}", model, T, B, steps, ref_args)


def main():
    ap = argparse.ArgumentParser(description="shardlm vs PyTorch training tokens/s")
    add_common_args(ap, "train_throughput.json", 10)
    ap.add_argument("--steps-124m", type=int, default=0, help="steps for the 124M shape (default: --steps)")
    ap.add_argument("--batch-124m", type=int, default=4)
    ap.add_argument("--shapes", default="small,124M", help="comma list of: " + ",".join(SHAPES))
    args = ap.parse_args()

    os.makedirs(OUT, exist_ok=True)
    env, coretype_env, cpu = bench_env(args)
    for s in args.shapes.split(","):
        if s not in SHAPES:
            raise SystemExit(f"error: unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    if args.check_only:
        return

    shapes = []
    for s in args.shapes.split(","):
        L, NH, C, T, B, V = SHAPES[s]
        steps = args.steps
        if s == "124M":
            B, steps = args.batch_124m, args.steps_124m or args.steps
        shapes.append(gpt2_shape(s, L, NH, C, T, B, V, steps))
    compare(args, shapes, Reference("torch", PYTHON), env, coretype_env, cpu)


if __name__ == "__main__":
    main()
