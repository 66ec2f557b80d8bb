#!/usr/bin/env python3
"""t_ckpt_faults — checkpoint saves that crash or fail (DESIGN §7): the previous
checkpoint and DIR/latest always survive, and resuming works.

Every run: mpirun -np 2, stage 3 fp32, the tiny t_resume model (2 layers,
C=32, T=16, vocab 100), checkpoint.every 5, keep 2.

Checks (one "ok NAME" / "FAIL NAME: why" line each; exit status 1 on failure):
  crash.P.*  for P in before_data, mid_data (on rank 1), before_rename,
             before_latest: a run of 5 steps saves step_000005.h5; a run resumed
             from it (--resume auto, train.steps 20) with SHARDLM_CKPT_CRASH=P
             dies at the save of step 10 (non-zero exit, within 60 s);
             step_000005.h5 is bitwise unchanged and latest still names it
             (before_latest: step_000010.h5 exists, latest still names step 5,
             so auto-resume uses step 5); a third run with --resume auto resumes
             from step 5, finishes 20 steps with exit 0, its losses bitwise equal
             to an uninterrupted 20-step run's steps 6..20, and leaves
             step_000020.h5 + latest naming it and no *.tmp file.
  fail.K.M.* K = notdir (checkpoint.dir under a regular file: mkdir fails with
             ENOTDIR; resumed with --resume DIR of the good checkpoints), fsize
             (`ulimit -f 64` in the rank processes, dash's 512-byte blocks = 32
             KiB, ranks over TCP since Open MPI's shared memory needs bigger
             files: "File too large"; same DIR) or enospc (DIR is a 1600 KiB
             tmpfs, mounted when allowed, i.e. as root; else skipped with a
             note: "No space left on device"); M = on_error stop: exit 2,
             exactly one "error" line naming the directory and the reason;
             continue: exit 0, the 10-step run finishes with a warning line
             naming the reason. Both: step_000005.h5 bitwise unchanged, latest
             unchanged, no step_000010.h5(.tmp) left. (fsize and enospc are
             caught by ckpt_try_save's check before HDF5 writes: getrlimit and
             fallocate of the .tmp file; see ckpt.h.)
  config.on_error.bad   checkpoint.on_error "maybe": exit 2 naming the key.
  lock.*     one run per checkpoint.dir (issue 46), with real concurrent
             processes (one rank each): a holder frozen inside its first step
             (SHARDLM_INJECT_SIGNAL=step:STOP) makes a second run exit 2 in one
             line naming the directory and the holder's pid, with no file of
             the directory changed (a planted .tmp of the holder's save
             included); after kill -9 of the holder the next run resumes
             (the kernel dropped the flock) and removes the stale .tmp. Two
             runs started together: one trains, one exits 2, the checkpoints
             are the winner's. noflock: SHARDLM_TEST_NO_FLOCK's O_EXCL lock
             file refuses, is taken over after kill -9, removed at the end.

Whole test ~20 s on 2 cores. Environment: SHARDLM_BIN, SHARDLM_TEST_TMP (see
harness.py).
"""
import atexit
import hashlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, check, failures, note, scratch_dir, write_shard  # noqa: E402

import numpy as np  # noqa: E402

TMP = scratch_dir("t_ckpt_faults")
V, T, C, L = 100, 16, 32, 2
N = 2
rng = np.random.default_rng(4242)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, rng.integers(0, V, size=150 * T + 1))


def make_config(name, ckdir, steps, on_error=None, every=5, keep=2):
    cfg = {
        "model": {"n_layer": L, "n_head": 2, "n_embd": C, "n_positions": T, "vocab_size": V},
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 1234, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": 24,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "checkpoint": {"dir": ckdir, "every": every, "keep": keep},
    }
    if on_error:
        cfg["checkpoint"]["on_error"] = on_error
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


class Run:
    def __init__(self, rc, out, err, secs, losses):
        self.rc, self.out, self.err, self.secs, self.losses = rc, out, err, secs, losses

    def tail(self, n=4):
        return " | ".join((self.out + self.err).strip().splitlines()[-n:])


def run(name, cfg, *extra, env=None, fsize_kib=None, timeout=120):
    """fsize_kib: RLIMIT_FSIZE (ulimit -f) of the rank processes only (mpirun's
    PMIx needs bigger files of its own)."""
    with open(cfg) as f:
        mpath = json.load(f)["train"]["metrics"]
    if os.path.exists(mpath):
        os.remove(mpath)
    prog = [BIN]
    if fsize_kib is not None:
        prog = ["/bin/sh", "-c", f'ulimit -f {fsize_kib} && exec "$0" "$@"', BIN]
    cmd = ["mpirun", "-np", str(N), "--oversubscribe"] + prog + ["train", cfg, "--quiet"] + list(extra)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        rc, out, err = r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, (e.stdout or b"").decode(errors="replace"), "timed out"
    secs = time.time() - t0
    with open(os.path.join(TMP, name + ".out"), "w") as f:
        f.write(" ".join(cmd) + "\n" + out + "\n--- stderr ---\n" + err)
    losses = {}
    if os.path.exists(mpath):
        with open(mpath) as f:
            for line in f:
                row = json.loads(line) if line.strip() else {}
                if "loss" in row:
                    losses[row["step"]] = row["loss"]
    return Run(rc, out, err, secs, losses)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def latest(d):
    try:
        with open(os.path.join(d, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def snapshot(d):
    return {"step5": digest(os.path.join(d, "step_000005.h5")), "latest": latest(d)}


def mount_tmpfs(d, size):
    """A small tmpfs at d (root only); False when mounting is not allowed here."""
    os.makedirs(d, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        return False
    atexit.register(subprocess.run, ["umount", d])
    return True


def good_checkpoint(name, tmpfs=None):
    """A directory holding step_000005.h5 (+ latest) from a 5-step run."""
    d = os.path.join(TMP, name + ".ck")
    if tmpfs and not mount_tmpfs(d, tmpfs):
        note(f"{name}: cannot mount a tmpfs here (not root?): skipped")
        return None
    r = run(name + ".first", make_config(name + ".first", d, 5))
    ok = r.rc == 0 and latest(d) == "step_000005.h5"
    check(f"{name}.setup", ok, f"rc {r.rc}, latest {latest(d)}: {r.tail()}")
    return d if ok else None


def error_lines(r):
    return [ln for ln in r.err.splitlines() if ln.startswith("shardlm") and " error: " in ln]


def warning_lines(r):
    return [ln for ln in r.err.splitlines() if ln.startswith("shardlm") and " warning: " in ln]


# The uninterrupted reference: 20 steps.
ref = run("ref", make_config("ref", os.path.join(TMP, "ref.ck"), 20))
check("ref.runs", ref.rc == 0 and len(ref.losses) == 20, f"rc {ref.rc}, {len(ref.losses)} steps: {ref.tail()}")

# ---------------------------------------------------------------- crashes
for point, rank in (("before_data", 0), ("mid_data", 1), ("before_rename", 0), ("before_latest", 0)):
    name = f"crash.{point}"
    d = good_checkpoint(name)
    if not d:
        continue
    before = snapshot(d)
    cfg = make_config(name + ".run", d, 20)
    env = dict(ENV, SHARDLM_CKPT_CRASH=f"{point}:{rank}")
    r = run(name + ".crash", cfg, "--resume", "auto", env=env, timeout=90)
    check(f"{name}.dies", r.rc not in (None, 0) and r.secs < 60,
          f"rc {r.rc} after {r.secs:.1f} s: {r.tail()}")
    check(f"{name}.hook_fired", f"killing myself at {point}" in r.err, r.tail())
    after = snapshot(d)
    check(f"{name}.previous_intact", after == before, f"before {before}, after {after}")
    files = sorted(os.listdir(d))
    if point == "before_latest":
        check(f"{name}.new_file_unpublished", "step_000010.h5" in files and latest(d) == "step_000005.h5",
              f"files {files}, latest {latest(d)}")
    else:
        check(f"{name}.nothing_published", "step_000010.h5" not in files, f"files {files}")
    r = run(name + ".resume", cfg, "--resume", "auto")
    check(f"{name}.resume.exit0", r.rc == 0, f"rc {r.rc}: {r.tail()}")
    check(f"{name}.resume.from_step5", f"resumed from {d}/step_000005.h5 at step 5" in r.out, r.tail(8))
    want = {s: ref.losses.get(s) for s in range(6, 21)}
    check(f"{name}.resume.losses_equal", r.losses == want,
          f"steps {sorted(r.losses)[:3]}..., first diff "
          f"{next(((s, r.losses.get(s), want[s]) for s in want if r.losses.get(s) != want[s]), None)}")
    files = sorted(os.listdir(d))
    check(f"{name}.resume.clean", latest(d) == "step_000020.h5" and "step_000020.h5" in files and
          not any(f.endswith(".tmp") for f in files), f"files {files}, latest {latest(d)}")

# ---------------------------------------------------------------- write failures
blocker = os.path.join(TMP, "a_regular_file")
with open(blocker, "w") as f:
    f.write("not a directory\n")
FSIZE_KIB = 64
for kind in ("notdir", "fsize", "enospc"):
    for mode in ("stop", "continue"):
        name = f"fail.{kind}.{mode}"
        # enospc: 1600 KiB hold the reservation of the step-5 file (1.4 MB:
        # the state plus 1 MiB) and then the file (400 KB), not the file and
        # a second reservation.
        d = good_checkpoint(name, tmpfs="1600k" if kind == "enospc" else None)
        if not d:
            continue
        before = snapshot(d)
        if kind == "notdir":
            target = os.path.join(blocker, "sub")
            cfg = make_config(name + ".run", target, 10, on_error=mode)
            r = run(name + ".run", cfg, "--resume", d)
            reason = "Not a directory"
        elif kind == "enospc":
            target = d
            cfg = make_config(name + ".run", target, 10, on_error=mode)
            r = run(name + ".run", cfg, "--resume", "auto", timeout=60)
            reason = "No space left on device"
        else:
            target = d
            cfg = make_config(name + ".run", target, 10, on_error=mode)
            # Open MPI's shared-memory transport needs files larger than the
            # limit: the ranks talk over TCP in these runs.
            r = run(name + ".run", cfg, "--resume", "auto", fsize_kib=FSIZE_KIB, timeout=60,
                    env=dict(ENV, OMPI_MCA_btl="self,tcp"))
            reason = "File too large"
        errs, warns = error_lines(r), warning_lines(r)
        if mode == "stop":
            check(f"{name}.exit2", r.rc == 2, f"rc {r.rc}: {r.tail()}")
            check(f"{name}.one_error_line", len(errs) == 1 and reason in errs[0] and target in errs[0],
                  f"error lines {errs}")
        else:
            check(f"{name}.exit0", r.rc == 0 and len(r.losses) == 5, f"rc {r.rc}, steps {sorted(r.losses)}: "
                  f"{r.tail()}")
            check(f"{name}.warning", any(reason in w and "continues" in w for w in warns) and not errs,
                  f"warnings {warns}, errors {errs}")
        after = snapshot(d)
        check(f"{name}.previous_intact", after == before, f"before {before}, after {after}")
        files = sorted(os.listdir(d))
        check(f"{name}.no_leftovers", not any(f.startswith("step_000010") for f in files), f"files {files}")

# ---------------------------------------------------------------- one run per directory (issue 46)
def start_alone(name, cfg, *extra, env=None):
    """`shardlm train CFG` as one process (an MPI singleton: the pid is the rank's), output to TMP/NAME.out."""
    path = os.path.join(TMP, name + ".out")
    with open(path, "w") as out:
        proc = subprocess.Popen([BIN, "train", cfg, "--quiet"] + list(extra), env=env or ENV, stdout=out,
                                stderr=subprocess.STDOUT)
    proc.out_path = path
    return proc


def proc_state(pid):
    """The state letter of /proc/PID/stat ("T": stopped), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def wait_stopped_or_exited(procs, deadline=120):
    """Waits (polling the processes' states, no fixed sleep) until each of PROCS has either exited or stopped
    itself (SHARDLM_INJECT_SIGNAL=PHASE:STOP); returns {proc: "stopped" | exit status | None (still running)}."""
    t0 = time.time()
    while time.time() - t0 < deadline:
        seen = {p: p.poll() if p.poll() is not None else ("stopped" if proc_state(p.pid) == "T" else None)
                for p in procs}
        if all(v is not None for v in seen.values()):
            return seen
        time.sleep(0.02)
    return seen


def lock_cases():
    # A run holding the directory, frozen inside its first step after resuming step 5 (SIGSTOP at a known point):
    # a second run stops at once in one line naming the directory and the holder, changing nothing (not even the
    # holder's in-progress .tmp); the holder killed with -9, the kernel drops its flock and a third run resumes.
    d = good_checkpoint("lock.held")
    if not d:
        return
    cfg = make_config("lock.held.run", d, 20)
    holder = start_alone("lock.held.holder", cfg, "--resume", "auto", env=dict(ENV, SHARDLM_INJECT_SIGNAL="step:STOP"))
    state = wait_stopped_or_exited([holder])[holder]
    check("lock.held.holder_frozen", state == "stopped", f"holder: {state}: {text_of(holder)[-300:]}")
    if state != "stopped":
        holder.kill()
        return
    tmp = os.path.join(d, "step_000006.h5.tmp")  # as the holder's save in progress would leave it
    with open(tmp, "wb") as f:
        f.write(b"a save in progress")
    before = files_of(d)
    r = run("lock.held.second", make_config("lock.held.other", d, 20), "--set", "train.seed=99")
    errs = error_lines(r)
    check("lock.held.second.refused", r.rc == 2 and len(errs) == 1 and f"'{d}'" in errs[0] and "in use by another run"
          in errs[0] and f"pid {holder.pid} " in errs[0], f"rc {r.rc}, error lines {errs}: {r.tail()}")
    check("lock.held.second.nothing_changed", files_of(d) == before, f"before {before}, after {files_of(d)}")
    holder.kill()  # SIGKILL, also to a stopped process
    holder.wait()
    r = run("lock.held.after_kill", cfg, "--resume", "auto")
    check("lock.held.after_kill.resumes", r.rc == 0 and f"resumed from {d}/step_000005.h5 at step 5" in r.out and
          "step_000006.h5.tmp" in r.err and latest(d) == "step_000020.h5",
          f"rc {r.rc}, latest {latest(d)}: {r.tail(8)}")
    check("lock.held.after_kill.no_tmp", not any(f.endswith(".tmp") for f in os.listdir(d)), sorted(os.listdir(d)))

    # Two runs started together on a fresh directory: exactly one trains (and holds the directory, frozen after
    # its last save); the other stops in one line before writing anything. Whichever wins, the checkpoints are
    # the winner's alone: its step_000003.h5 resumes.
    d = os.path.join(TMP, "lock.race.ck")
    cfgs = [make_config(f"lock.race.{i}", d, 3, every=1, keep=0) for i in range(2)]
    env = dict(ENV, SHARDLM_INJECT_SIGNAL="exit:STOP")
    procs = [start_alone(f"lock.race.{i}", cfgs[i], env=env) for i in range(2)]
    states = wait_stopped_or_exited(procs)
    outcome = sorted(str(v) for v in states.values())
    loser = next((p for p in procs if states[p] == 2), None)
    check("lock.race.one_wins", outcome == ["2", "stopped"] and loser is not None and
          "in use by another run" in text_of(loser), f"states {outcome}")
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    files = sorted(os.listdir(d))
    check("lock.race.one_run_of_files", files == [".shardlm.lock", "latest", "step_000001.h5", "step_000002.h5",
                                                   "step_000003.h5"] and latest(d) == "step_000003.h5", files)
    r = run("lock.race.resume", make_config("lock.race.resume", d, 4, every=1, keep=0), "--resume", "auto")
    check("lock.race.resume", r.rc == 0 and f"resumed from {d}/step_000003.h5 at step 3" in r.out, r.tail(6))

    # Where flock is not honoured (SHARDLM_TEST_NO_FLOCK=1 takes that path): the lock is the O_EXCL file
    # .shardlm.lock.held; a second run is refused naming it; after a kill -9 of its holder a run of the same host
    # takes it over (the recorded pid is gone), and a run that ends removes it.
    d = os.path.join(TMP, "lock.noflock.ck")
    env = dict(ENV, SHARDLM_TEST_NO_FLOCK="1")
    cfg = make_config("lock.noflock", d, 1)
    holder = start_alone("lock.noflock.holder", cfg, env=dict(env, SHARDLM_INJECT_SIGNAL="setup:STOP"))
    state = wait_stopped_or_exited([holder])[holder]
    held = os.path.join(d, ".shardlm.lock.held")
    second = start_alone("lock.noflock.second", cfg, env=env)
    second.wait()
    check("lock.noflock.second.refused", state == "stopped" and second.returncode == 2 and
          f"remove '{held}'" in text_of(second) and f"pid {holder.pid} " in text_of(second),
          f"holder {state}, second rc {second.returncode}: {text_of(second)[-400:]}")
    holder.kill()
    holder.wait()
    third = start_alone("lock.noflock.third", cfg, env=env)
    third.wait()
    check("lock.noflock.after_kill", third.returncode == 0 and "the lock of a run that ended" in text_of(third) and
          not os.path.exists(held) and latest(d) == "step_000001.h5", f"rc {third.returncode}, held file there: "
          f"{os.path.exists(held)}: {text_of(third)[-400:]}")


def files_of(d):
    return {n: digest(os.path.join(d, n)) for n in sorted(os.listdir(d))}


def text_of(proc):
    """What a process of start_alone printed so far."""
    with open(proc.out_path) as f:
        return f.read()


lock_cases()

# ---------------------------------------------------------------- config
bad = make_config("config.bad", os.path.join(TMP, "bad.ck"), 1, on_error="maybe")
r = run("config.bad", bad)
check("config.on_error.bad", r.rc == 2 and "checkpoint.on_error" in r.err, f"rc {r.rc}: {r.tail()}")

note(f"scratch {TMP}")
sys.exit(1 if failures() else 0)
