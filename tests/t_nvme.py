#!/usr/bin/env python3
"""t_nvme — offload_optimizer "nvme" in the trainer (src/zero/nvme.c through the
engine): each rank's fp32 master, Adam m and v in its file under nvme_path, the
AdamW step streamed through the pinned buffers.

Every run at N > 1 goes through `mpirun -np N --oversubscribe bin/shardlm train ...`; at N=1 the
binary runs alone (MPI's singleton init: mpirun costs seconds, most where a rank fails).
Small model: 2 layers, 2 heads, C=32, T=16, vocab 100; 3 steps (fp16: 4, an
overflow injected at step 2, so that the loss scaler skips a step).

Checks (one "ok NAME" / "FAIL NAME: why" line each):
  same.CASE     nvme against offload_optimizer "cpu", same everything else:
                every step's loss, grad norm and loss scale, the final parameters
                (--dump-final) and the final checkpoint's master, adam_m and
                adam_v datasets bitwise equal; memory: master, Adam m and v
                planned = peak = 0 under nvme; the file gone after the run.
                CASEs cover fp32, bf16, fp16 (its scaler skipping a step),
                N = 1, 2, 3 and stages 1, 2, 3, and the engine's device path
                (SHARDLM_EMULATE_DEVICE=1, fp32 activations, stages 3 and 1:
                the fp32 gradients in device memory, where the host cannot
                touch them, each unit's fetched into a pinned stage before its
                update; its new master staged in pinned memory, cast by the
                device; the gradient class "device" under nvme, "pinned host"
                under "cpu"), and a LoRA run (the adapters' state in the
                file, the frozen base none)
  resume.*      from the step-2 checkpoints of same.n2_s3_fp32 (saved every step) to step
                3: nvme resumed under nvme, nvme under "cpu" and "cpu" under nvme, step 3's
                values and the final parameters bitwise equal to the uninterrupted runs
  kill.*        same.n1_s1_fp32 under nvme with SHARDLM_NVME_PIECE=4096 (7 pieces in the
                file): the job killed (SIGKILL, SHARDLM_INJECT_NVME=kill:K) after the first
                piece write of step 3's optimizer step, its file part new and part old:
                exit status not 0, steps 1-2 logged, the step-2 checkpoint and latest
                intact; --resume auto to step 3 bitwise equal to the uninterrupted run
  io.*          the same with an injected short write in step 3 (SHARDLM_INJECT_NVME=
                short_write:K): exit 2, one error line naming the file, the file
                removed; resumed from the step-2 checkpoint: equal to the uninterrupted run
  rss.*         N = 1 and 2, stage 1, fp32, a 10 M-parameter model (114 MiB of state at N=1) with
                SHARDLM_NVME_PIECE=262144 (12 MiB of buffers): each rank's peak RSS (VmHWM, the metrics'
                host_rss_peak) under nvme <= what `shardlm plan --json --target cpu` puts in the rank
                (device space, which is host memory on the CPU backend, + pinned + ordinary + the NVMe
                buffers) + the process's baseline (a tiny model's peak less its plan, measured at the same N,
                ~21 MiB: libraries, MPI, OpenBLAS; sane: below 64 MiB) + the parameters' init staging (the
                largest unit in fp32 twice, freed before step 1) + 16 MiB (allocator and OpenBLAS areas that
                grow with the matrices); the "cpu" run's peak holds the whole state (master + m + v) and
                exceeds that bound
  bad.*         nvme_path a file; nvme_path under a file (cannot be made); a file
                size limit (ulimit -f: the file cannot be allocated); a disk without
                room (full_disk: a 48 KiB tmpfs mounted on the test's dir, root, N=2,
                the statvfs check itself): exit 2 before step 1, one line naming the
                path, the bytes free and the bytes needed (the plan's file), the tmpfs
                warning shown first; a second job on the same files (the same
                SLURM_JOB_ID, N=2, its rank-1 file held locked: the ranks agree
                before the parameters' init): exit 2 and one line
                naming the path; a tmpfs nvme_path (/dev/shm): runs, with the
                warning that it is memory; a killed job's file (another job's
                name, unlocked, 2 minutes old) removed with a warning naming it,
                a live job's (locked) and a new one kept; (issue 46) a config error
                found once the files exist (train.metrics in a missing directory,
                N=2): one line, exit 2, nothing left in nvme_path

Environment: SHARDLM_BIN, SHARDLM_TEST_TMP (harness.py). Under BUILD=build-asan
(SHARDLM_BIN under build-asan) the rss check and the 17 M model are left out
(ASan's shadow memory decides the peak there), and it says so.
"""
import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, check, mount_full_disk, note, read_dump, run_main, scratch_dir, write_shard  # noqa: E402

try:
    import h5py
except ImportError:  # pragma: no cover
    h5py = None

TMP = scratch_dir("t_nvme")
ASAN = "build-asan" in BIN
V, T = 100, 16
SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": T, "vocab_size": V}
RSS_MODEL = {"n_layer": 3, "n_head": 8, "n_embd": 512, "n_positions": T, "vocab_size": 1024}
RSS_BASE = {"n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": T, "vocab_size": 128}
RSS_PIECE = 1 << 18  # SHARDLM_NVME_PIECE: 3 MiB buffers, so that the state outweighs them
MiB = 1 << 20

rng = np.random.default_rng(36)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, rng.integers(0, V, size=200 * T + 1))


def config(name, device, stage=2, dtype="fp32", steps=3, model=None, ckdir=None, every=0, nvme_path=None,
           extra=None):
    cfg = {
        "model": dict(model or SMALL),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 7, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": 12,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                              "offload_optimizer": {"device": device}},
    }
    if device == "nvme":
        cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_path or os.path.join(TMP, "nvme")
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 1}
    if ckdir:
        cfg["checkpoint"] = {"dir": ckdir, "every": every, "keep": 3}
    cfg.update(extra or {})
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


class Run:
    def __init__(self, name, rc, out, rows, final, nvme, memory, rss, host_rss):
        self.name, self.rc, self.out, self.rows, self.final = name, rc, out, rows, final
        self.nvme, self.memory, self.rss, self.host_rss = nvme, memory, rss, host_rss

    def col(self, k):
        return [r.get(k) for r in self.rows]

    def tail(self, n=3):
        return " | ".join(self.out.strip().splitlines()[-n:])


def run(name, N, cfg, *extra, env=None, final=True, fresh=True, rlimit=None, timeout=300):
    """Runs shardlm train under mpirun in a child Python, which reports the peak RSS of its children."""
    mpath = os.path.join(TMP, name + ".jsonl")
    if fresh and os.path.exists(mpath):
        os.remove(mpath)
    fpath = os.path.join(TMP, name + ".final")
    if os.path.exists(fpath):
        os.remove(fpath)
    # a file-size limit on the ranks only (mpirun's PMIx needs its files)
    limit = ["bash", "-c", f'ulimit -f {rlimit // 512}; exec "$@"', "ulimit"] if rlimit else []
    # N=1: the binary alone (MPI's singleton init; mpirun adds seconds, most where the rank fails)
    mpi = ["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 or rlimit else []
    args = mpi + limit + [BIN, "train", cfg, "--quiet"] + list(extra)
    if final:
        args += ["--dump-final", fpath]
    wrapper = ("import resource, subprocess, sys\n"
               "r = subprocess.run(sys.argv[1:])\n"
               "print('RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "sys.exit(r.returncode)\n")
    try:
        r = subprocess.run([sys.executable, "-c", wrapper] + args, env=env or ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        rc, out = r.returncode, r.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        rc, out = None, "timed out"
    with open(os.path.join(TMP, name + ".out"), "w") as f:
        f.write(out)
    rss = [int(line.split()[1]) for line in out.splitlines() if line.startswith("RSS_KIB")]
    out = "\n".join(line for line in out.splitlines() if not line.startswith("RSS_KIB"))
    rows, nvme, memory, host_rss = [], None, None, None
    if os.path.exists(mpath):
        with open(mpath) as f:
            for line in f:
                j = json.loads(line)
                if "loss" in j:
                    rows.append(j)
                nvme = j.get("nvme", nvme)
                memory = j.get("memory", memory)
                host_rss = j.get("host_rss_peak", host_rss)
    fin = read_dump(fpath) if final and rc == 0 and os.path.exists(fpath) else None
    return Run(name, rc, out, rows, fin, nvme, memory, rss[0] if rss else None, host_rss)


def ok(name, r, steps):
    if r.rc != 0:
        check(name, False, f"exit status {r.rc}: {r.tail()}")
        return False
    if r.col("step") != list(range(1, steps + 1)):
        check(name, False, f"metrics steps {r.col('step')}, expected 1..{steps}")
        return False
    return True


def params_differ(a, b):
    if a is None or b is None:
        return ["<no dump>"]
    return [n for n in b if n not in a or np.asarray(a[n]).tobytes() != np.asarray(b[n]).tobytes()]


def ckpt_differ(pa, pb):
    """The datasets of master, adam_m and adam_v that differ between two checkpoints."""
    if h5py is None:
        return ["<no h5py>"]
    bad = []
    with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
        for g in ("master", "adam_m", "adam_v"):
            if g not in fa or g not in fb or set(fa[g]) != set(fb[g]):
                bad.append(g)
                continue
            bad += [f"{g}/{k}" for k in fa[g] if fa[g][k][()].tobytes() != fb[g][k][()].tobytes()]
    return bad


def same_run(name, a, b, steps):
    """a (nvme) against b: per-step values and final parameters bitwise."""
    for k in ("loss", "grad_norm", "loss_scale", "skipped"):
        if a.col(k) != b.col(k):
            check(name, False, f"{k}: {a.col(k)} vs {b.col(k)}")
            return False
    bad = params_differ(a.final, b.final)
    if bad:
        check(name, False, f"final parameters differ: {bad[:4]}")
        return False
    return True


def nvme_files():
    d = os.path.join(TMP, "nvme")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


CASES = [  # name, N, stage, dtype, env extra, config extra
    ("n1_s1_fp32", 1, 1, "fp32", {}, {}),
    ("n2_s2_bf16", 2, 2, "bf16", {}, {}),
    ("n3_s3_fp16", 3, 3, "fp16", {"SHARDLM_INJECT_INF_STEP": "2"}, {}),
    ("n2_s3_fp32", 2, 3, "fp32", {}, {}),
    ("n2_s3_bf16_device", 2, 3, "bf16", {"SHARDLM_EMULATE_DEVICE": "1", "SHARDLM_FP32_ACTIVATIONS": "1"}, {}),
    # stage 1 on the device: the all-reduced fp32 gradients stay there (no pinned host copy of the range)
    ("n2_s1_fp16_device", 2, 1, "fp16", {"SHARDLM_EMULATE_DEVICE": "1", "SHARDLM_FP32_ACTIVATIONS": "1",
                                         "SHARDLM_INJECT_INF_STEP": "2"}, {}),
    # LoRA: the frozen base has no optimizer state; the adapters' is in the file
    ("n2_s2_bf16_lora", 2, 2, "bf16", {}, {"lora": {"r": 4, "alpha": 8}}),
]


SAME = {}  # name: {"cpu": Run, "nvme": Run}, the uninterrupted runs the resume, kill and io checks compare with
SHARED = ("n1_s1_fp32", "n2_s3_fp32")  # their checkpoints are saved every step
SHARED_STEPS = 3


def test_same():
    for name, N, stage, dtype, extra, cfg_extra in CASES:
        steps = 4 if dtype == "fp16" else 3
        env = dict(ENV, **extra)
        runs = {}
        for dev in ("cpu", "nvme"):
            ck = os.path.join(TMP, f"same_{name}_{dev}.ckpt")
            cfg = config(f"same_{name}_{dev}", dev, stage, dtype, steps, ckdir=ck, extra=cfg_extra,
                         every=1 if name in SHARED else 0)
            runs[dev] = run(f"same_{name}_{dev}", N, cfg, env=env)
        a, b = runs["nvme"], runs["cpu"]
        SAME[name] = runs
        if not (ok(f"same.{name}", a, steps) and ok(f"same.{name}", b, steps)):
            continue
        if not same_run(f"same.{name}", a, b, steps):
            continue
        if dtype == "fp16" and True not in a.col("skipped"):
            check(f"same.{name}", False, f"no step skipped: {a.col('skipped')}")
            continue
        ck = [os.path.join(TMP, f"same_{name}_{d}.ckpt", f"step_{steps:06d}.h5") for d in ("nvme", "cpu")]
        bad = ckpt_differ(*ck)
        mem, cpu_mem = a.memory or {}, b.memory or {}
        state = {k: mem.get(k, {}) for k in ("fp32 master weights", "Adam m", "Adam v")}
        mem_ok = all(v.get("planned") == 0 and v.get("peak") == 0 for v in state.values())
        if "device" in name:  # the master's class holds the one-unit pinned stage the device casts from
            master, cpu_master = state.pop("fp32 master weights"), cpu_mem.get("fp32 master weights", {})
            # the fp32 gradients: pinned host under "cpu", device memory under nvme (staged one unit at a time)
            g32, cpu_g32 = mem.get("fp32 gradient shard", {}), cpu_mem.get("fp32 gradient shard", {})
            mem_ok = all(v.get("planned") == 0 and v.get("peak") == 0 for v in state.values()) and \
                0 < master.get("planned", 0) == master.get("peak") < cpu_master.get("planned", 0) and \
                0 < g32.get("planned", 0) == g32.get("peak") and g32.get("space") == "device" and \
                cpu_g32.get("space") == "pinned host" and cpu_g32.get("planned", 0) > 0
        nv = a.nvme or {}
        check(f"same.{name}", not bad and mem_ok and nv.get("written_bytes", 0) > 0 and not nvme_files(),
              f"checkpoint datasets differ {bad[:4]}; state classes {state}; nvme {nv}; files left {nvme_files()}")


def uninterrupted(case, dev, check_name):
    """The same.* run of CASE under DEV (run by test_same when it has not run yet)."""
    if case not in SAME:
        saved = CASES[:]
        CASES[:] = [c for c in saved if c[0] == case]
        test_same()
        CASES[:] = saved
    u = SAME.get(case, {}).get(dev)
    if u is None or not ok(check_name, u, SHARED_STEPS):
        return None
    return u


def resumed_equal(name, b, u):
    """b, resumed after step 2, against u: step 3's values and the final parameters bitwise."""
    if b.rc != 0:
        check(name, False, f"exit status {b.rc}: {b.tail()}")
        return
    if b.col("step") != [SHARED_STEPS]:
        check(name, False, f"resumed steps {b.col('step')}, expected [{SHARED_STEPS}]")
        return
    for k in ("loss", "grad_norm", "loss_scale", "skipped"):
        if b.col(k) != u.col(k)[SHARED_STEPS - 1:]:
            check(name, False, f"{k}: {b.col(k)} vs {u.col(k)}")
            return
    bad = params_differ(b.final, u.final)
    check(name, not bad, f"final parameters differ: {bad[:4]}")


def step2(case, dev):
    return os.path.join(TMP, f"same_{case}_{dev}.ckpt", "step_000002.h5")


def test_resume():
    """same.n2_s3_fp32's runs (checkpoints every step): resumed after step 2 to step 3, under nvme, across."""
    case = "n2_s3_fp32"
    for name, first, second in (("nvme", "nvme", "nvme"), ("nvme_to_cpu", "nvme", "cpu"),
                                ("cpu_to_nvme", "cpu", "nvme")):
        u = uninterrupted(case, second, f"resume.{name}")
        if u is None or not os.path.exists(step2(case, first)):
            check(f"resume.{name}", False, f"no uninterrupted run or no {step2(case, first)}")
            continue
        cfg = config(f"res_{name}", second, 3, "fp32", SHARED_STEPS, ckdir=os.path.join(TMP, f"res_{name}.ckpt"))
        resumed_equal(f"resume.{name}", run(f"res_{name}", 2, cfg, "--resume", step2(case, first)), u)


# the kill and io checks: same.n1_s1_fp32's nvme run with pieces of 4096 elements (its state in 7 pieces)
FAULT_PIECE = 4096


def fault_case(name, env_extra):
    """Runs same.n1_s1_fp32 under nvme with checkpoints every step and the fault; returns (run, pieces, ckdir)."""
    env = dict(ENV, SHARDLM_NVME_PIECE=str(FAULT_PIECE))
    ck, nvdir = os.path.join(TMP, f"{name}.ckpt"), os.path.join(TMP, f"nvme_{name}")
    cfg = config(name, "nvme", 1, "fp32", SHARED_STEPS, ckdir=ck, every=1, nvme_path=nvdir)
    pl = plan_json(cfg, 1, env)
    pieces = pl["nvme"]["optimizer_file"] // (12 * pl["nvme"]["optimizer_piece"]) if pl else 0
    check(f"{name}.pieces", pieces >= 3, f"{pieces} pieces of {FAULT_PIECE}: {pl and pl['nvme']}")
    a = run(name, 1, cfg, env=dict(env, SHARDLM_INJECT_NVME=env_extra(pieces)), final=False)
    return a, cfg, env, ck, nvdir


def test_kill():
    u = uninterrupted("n1_s1_fp32", "nvme", "kill.uninterrupted")
    if u is None:
        return
    # killed (SIGKILL) after the first piece write of step 3's optimizer step: the file half new, half old
    a, cfg, env, ck, _ = fault_case("kill", lambda pieces: f"kill:{2 * pieces + 1}")
    latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(os.path.join(ck, "latest")) else ""
    check("kill.killed", a.rc not in (0, None) and a.col("step") == [1, 2] and latest == "step_000002.h5",
          f"exit {a.rc}, steps {a.col('step')}, latest '{latest}': {a.tail()}")
    resumed_equal("kill.resume", run("kill", 1, cfg, "--resume", "auto", env=env), u)


def test_io_error():
    u = uninterrupted("n1_s1_fp32", "nvme", "io.uninterrupted")
    if u is None:
        return
    # the first piece write of step 3 comes back short
    a, cfg, env, _, nvdir = fault_case("io", lambda pieces: f"short_write:{2 * pieces + 1}")
    errors = [line for line in a.out.splitlines() if "error" in line]
    named = len(errors) == 1 and "short write" in errors[0] and os.path.join(nvdir, "shardlm-") in errors[0]
    left = os.listdir(nvdir) if os.path.isdir(nvdir) else []
    check("io.short_write", a.rc == 2 and named and a.col("step") == [1, 2] and not left,
          f"exit {a.rc}, steps {a.col('step')}, error lines {errors}, files left {left}")
    resumed_equal("io.resume", run("io", 1, cfg, "--resume", "auto", env=env), u)


def plan_json(cfg, N, env):
    r = subprocess.run([BIN, "plan", cfg, "--ranks", str(N), "--target", "cpu", "--json"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def plan_process_bytes(pl, N):
    """What the plan puts in one rank's memory on the CPU backend: its device space (host memory there), pinned
    and ordinary host memory and the NVMe buffers (plan_host_bytes: host_per_node over the node's N ranks)."""
    return pl["space_total"]["device"] + pl["host_per_node"] / N


def test_rss():
    """Each rank's peak RSS (VmHWM, the metrics' host_rss_peak) against the plan's bytes for that rank."""
    if ASAN:
        note("rss: left out under ASan (its shadow memory decides the peak)")
        return
    env = dict(ENV, SHARDLM_NVME_PIECE=str(RSS_PIECE))
    C = RSS_MODEL["n_embd"]
    # the parameters' init stages the largest unit (a block: 12 C^2 + 13 C elements) in an fp32 scratch and an
    # fp32 cast buffer (zero.c zero_init), freed before step 1 and outside the plan's buffers
    staging = 8 * (12 * C * C + 13 * C + 65536)
    slack = 16 * MiB  # allocator and OpenBLAS work areas that grow with the matrices, beyond the tiny run's
    for N in (1, 2):
        # the process's own baseline (libraries, MPI, OpenBLAS, the log): a tiny model's peak less its plan
        cfg = config(f"rss_base_{N}", "nvme", 1, "fp32", 1, model=RSS_BASE)
        base, pl = run(f"rss_base_{N}", N, cfg, env=env, final=False), plan_json(cfg, N, env)
        if not ok(f"rss.N{N}.baseline", base, 1) or not pl or not base.host_rss:
            check(f"rss.N{N}.baseline", False, f"no plan or no host_rss_peak: {base.tail()}")
            continue
        baseline = max(base.host_rss) - plan_process_bytes(pl, N)
        check(f"rss.N{N}.baseline", 0 < baseline < 64 * MiB, f"{baseline / MiB:.1f} MiB")
        r, plans = {}, {}
        for dev in ("cpu", "nvme"):
            cfg = config(f"rss_{dev}_{N}", dev, 1, "fp32", 1, model=RSS_MODEL)
            r[dev], plans[dev] = run(f"rss_{dev}_{N}", N, cfg, env=env, final=False), plan_json(cfg, N, env)
        if not all(ok(f"rss.N{N}.{d}", r[d], 1) and plans[d] and r[d].host_rss for d in r):
            check(f"rss.N{N}", False, "a run or its plan failed")
            continue
        pn = plans["nvme"]
        planned = plan_process_bytes(pn, N)
        bound = planned + baseline + staging + slack
        state = sum(plans["cpu"]["memory"][k]["bytes"] for k in ("fp32 master weights", "Adam m", "Adam v"))
        nv_rss, cpu_rss = max(r["nvme"].host_rss), min(r["cpu"].host_rss)
        note(f"rss N={N}: nvme peak {nv_rss / MiB:.1f} MiB <= plan {planned / MiB:.1f} (NVMe buffers "
             f"{pn['nvme']['optimizer_buffers'] / MiB:.1f}) + baseline {baseline / MiB:.1f} + init staging "
             f"{staging / MiB:.1f} + {slack / MiB:.0f} = {bound / MiB:.1f} MiB; cpu peak {cpu_rss / MiB:.1f} MiB, "
             f"state {state / MiB:.1f} MiB per rank")
        check(f"rss.N{N}.nvme_within_plan", nv_rss <= bound and pn["nvme"]["optimizer_buffers"] * 3 < state,
              f"nvme peak {nv_rss} B > {bound:.0f} B, or buffers {pn['nvme']['optimizer_buffers']} B not well "
              f"below the state {state} B")
        # CPU offload holds the whole state, and the bound above tells the two apart
        check(f"rss.N{N}.cpu_holds_state", cpu_rss >= state and cpu_rss > bound,
              f"cpu peak {cpu_rss} B, state {state} B, the nvme bound {bound:.0f} B")


def one_error_line(name, r, *words):
    errors = [line for line in r.out.splitlines() if "error" in line]
    check(name, r.rc == 2 and len(errors) == 1 and all(w in errors[0] for w in words),
          f"exit {r.rc}, error lines {errors}, wanted {words}: {r.tail()}")


def test_bad():
    afile = os.path.join(TMP, "a_file")
    open(afile, "w").write("x")
    r = run("bad_file", 1, config("bad_file", "nvme", 1, nvme_path=afile), final=False)
    one_error_line("bad.not_a_directory", r, afile, "not a directory")
    under = os.path.join(afile, "sub")
    r = run("bad_make", 1, config("bad_make", "nvme", 1, nvme_path=under), final=False)
    one_error_line("bad.cannot_make", r, under, "Not a directory")
    r = run("bad_room", 1, config("bad_room", "nvme", 1, nvme_path=os.path.join(TMP, "room")), final=False,
            rlimit=64 * 1024)
    one_error_line("bad.no_room", r, os.path.join(TMP, "room", "shardlm-"), "File too large")
    # a disk without room for the file, end to end: a 48 KiB tmpfs mounted on the test's dir (root; the statvfs
    # check, no shim): stopped before step 1, one line naming the path, the bytes free and needed, the tmpfs warning
    mnt = os.path.join(TMP, "full")
    if mount_full_disk(mnt, "bad.full_disk"):
        try:
            cfg = config("bad_full", "nvme", 2, nvme_path=mnt)
            vfs = os.statvfs(mnt)
            free, pl = vfs.f_bavail * vfs.f_frsize, plan_json(cfg, 2, ENV)
            r = run("bad_full", 2, cfg, final=False)
        finally:
            subprocess.run(["umount", mnt])
        need = pl["nvme"]["optimizer_file"] if pl else -1
        one_error_line("bad.full_disk", r, f"nvme_path '{mnt}' has {free} bytes", f"needs {need} bytes",
                       "free space or choose another disk")
        warned = [line for line in r.out.splitlines() if "warning" in line and "is tmpfs: memory, not disk" in line]
        check("bad.full_disk_before_step_1", need > free and not r.rows and len(warned) >= 1 and mnt in warned[0],
              f"needs {need} B, free {free} B, steps {r.col('step')}, tmpfs warnings {warned}")
    # issue 46: a config error found once the state files exist (train.metrics in a missing directory, opened
    # after the set-up): one line, exit 2, and no preallocated file left in nvme_path on either rank
    late = os.path.join(TMP, "late")
    shutil.rmtree(late, ignore_errors=True)
    os.makedirs(late)
    missing = os.path.join(TMP, "no_such_dir", "late.jsonl")
    r = run("late_error", 2, config("late_error", "nvme", 1, nvme_path=late,
                                    extra={"train": {"steps": 3, "seed": 7, "eval_every": 0, "sample_tokens": 0,
                                                     "metrics": missing}}), final=False)
    one_error_line("bad.late_config_error", r, missing, "train.metrics")
    check("bad.late_config_error_no_file_left", os.listdir(late) == [], f"left in {late}: {os.listdir(late)}")
    # a second job on the same files: the same Slurm job id, its rank-1 file locked by the first (N=2: rank 0
    # opens its own, and the ranks agree on rank 1's line before the parameters' init)
    lockdir = os.path.join(TMP, "locked")
    os.makedirs(lockdir, exist_ok=True)
    held = os.path.join(lockdir, "shardlm-36777-rank1.optim")
    with open(held, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run("bad_lock", 2, config("bad_lock", "nvme", 1, nvme_path=lockdir), final=False,
                env=dict(ENV, SLURM_JOB_ID="36777"))
        one_error_line("bad.second_job", r, held, "in use by another job")
    check("bad.second_job_file_kept", os.path.exists(held), "the first job's file was removed")
    # a killed job's file (unlocked, 2 minutes old) is removed with a warning; a live job's (locked) and a
    # new one are kept
    stale_dir = os.path.join(TMP, "stale")
    os.makedirs(stale_dir, exist_ok=True)
    names = {k: os.path.join(stale_dir, f"shardlm-{k}-rank0.optim") for k in ("killed", "live", "new")}
    for k, path in names.items():
        with open(path, "wb") as f:
            f.write(b"\0" * 8192)
        if k != "new":
            os.utime(path, (os.path.getmtime(path) - 120,) * 2)
    with open(names["live"]) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run("stale", 1, config("stale", "nvme", 1, nvme_path=stale_dir), final=False)
    warned = [line for line in r.out.splitlines() if "warning" in line and "removed" in line]
    check("bad.stale_swept", r.rc == 0 and not os.path.exists(names["killed"]) and os.path.exists(names["live"])
          and os.path.exists(names["new"]) and len(warned) == 1 and names["killed"] in warned[0],
          f"exit {r.rc}, files {sorted(os.listdir(stale_dir))}, warnings {warned}")
    if os.path.isdir("/dev/shm"):
        shm = f"/dev/shm/t_nvme.{os.getpid()}"
        r = run("tmpfs", 1, config("tmpfs", "nvme", 1, nvme_path=shm), final=False)
        # (tmpfs takes O_DIRECT since Linux 6.6: the buffered fallback's warning is test_nvme.c's to check)
        warned = [line for line in r.out.splitlines() if "warning" in line and shm in line]
        check("bad.tmpfs_warns", r.rc == 0 and len(warned) == 1 and "is tmpfs: memory, not disk" in warned[0],
              f"exit {r.rc}, warnings {warned}: {r.tail(6)}")
        subprocess.run(["rm", "-rf", shm])


def main():
    only = os.environ.get("T_NVME_ONLY")  # a comma-separated subset while working on one
    for t in (test_same, test_resume, test_kill, test_io_error, test_rss, test_bad):
        if not only or t.__name__[5:] in only.split(","):
            t()


if __name__ == "__main__":
    run_main("t_nvme", main)
