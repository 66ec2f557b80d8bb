#!/usr/bin/env python3
"""t_slurm — the job scripts of jobs/ on a real single-node Slurm cluster
(munged, slurmctld, slurmd on localhost), which the test starts with
tools/slurm-local/start.sh and stops with tools/slurm-local/stop.sh, also
when a check fails or the test is killed by SIGTERM. Needs root (it starts
system daemons); a cluster that does not start is a failure, never a skip.

Model: 2 layers, 2 heads, C=64, T=64, vocab 100, train_batch_size 16 = micro 2
x accumulation 16/(2N), ZeRO stage 3, lr 1e-3, a period-50 token sequence
that the model learns (the loss falls by 10% within 10 steps, by 30% in 20). Jobs are
submitted from a scratch directory with SHARDLM_HOME pointing at this
checkout and SHARDLM_BIN at the binary under test; the node advertises 8 CPUs,
so several jobs run at once.

Checks (one "ok NAME" / "FAIL NAME: why" line each; exit status 1 on failure):
  requeue_retry.*
              jobs/lib.sh's shardlm_requeue with a fake scontrol that fails 2 (9) times:
              succeeds on the 3rd try (gives up with status 1 after 5)
  cluster.*   start.sh brings the node up (idle); stop.sh leaves no daemon of its own
  sbatch2.*, sbatch4.*
              jobs/cpu.sbatch with --ntasks-per-node 2 and 4, 20 steps: COMPLETED 0:0, the
              log (logs/shardlm-cpu-JOBID.out) has the allocation ("tasks N"),
              "N ranks", the resolved config (its train.steps 20 and the derived
              gradient_accumulation_steps 16/(2N)), the memory plan table, "no
              checkpoint ...: starting fresh" (the first start of --resume auto);
              metrics steps 1..20, the last loss below 0.9 x the first
  srun.*      jobs/srun.sh --ntasks=2 -- CONFIG: exit 0, "2 ranks", 20 metrics steps
  preempt.*   jobs/cpu.sbatch, 2 tasks, 300 steps of 48 sequences; once the metrics file
              has step 1, scancel -s USR1: the job goes back to PENDING with Restarts=1, its log
              says "stopped by SIGUSR1" at step S and that the job is requeued,
              DIR/step_S.h5 exists with attribute step S and latest names it;
              released (scontrol update StartTime=now, as the requeue sets a
              begin time 2 min ahead), it runs again: COMPLETED 0:0, "run 2
              (restart count 1)", "resumed from DIR/step_S.h5 at step S"; the
              metrics hold steps 1..300 once each and every loss from step S+1 on,
              the final one included, equals bitwise that of an uninterrupted job
              of the same config
  timelimit.* jobs/cpu.sbatch, 1 task, --time=1 --signal=USR1@50 and 10^7 steps: Slurm's own
              signal before the time limit stops it, "stopped by SIGUSR1" at step S,
              DIR/step_S.h5, the job requeued (Restarts=1); then it is cancelled
  badconfig.* jobs/cpu.sbatch with a config holding an unknown key: FAILED with
              ExitCode 2:0 within 120 s of its start, the log has "shardlm: error:" naming the
              key and "not requeued", Restarts=0
  templates.* jobs/gpu-node.sbatch, gpu-multinode.sbatch and llama2-70b-finetune.sbatch
              submitted with their GPU and node counts overridden on the sbatch line
              (--gpus-per-node=0, 1 node, 2 tasks, 1 CPU each) and the CPU binary and
              tiny config: COMPLETED 0:0, 10 metrics steps. (The 70B template's own
              config needs the Llama model of a later issue.)

The whole test takes about 50 s on the 2-core development machine (start 3.5 s; the
time-limit job waits for slurmctld's 30-s timer). The jobs compete for the 2 cores, so no
job is held to a wall time: a job fails when it pends too long or stops writing while it
runs (see JOB_STALL). Client commands are retried while
slurmctld does not answer (see slurm()); the cluster keeps its state on /dev/shm
(tools/slurm-local/common.sh), where slurmctld's fsyncs do not wait for a busy disk.
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import BIN, ENV, ROOT, check, note, scratch_dir, write_shard  # noqa: E402

try:
    import h5py
except ImportError:  # pragma: no cover
    h5py = None

TMP = scratch_dir("t_slurm")
SLURM_TOOLS = os.path.join(ROOT, "tools", "slurm-local")
JOBS = os.path.join(ROOT, "jobs")
# The jobs share 2 cores, so how long one takes depends on what else runs (the 4-rank job
# needs 1 s alone, 6-9 s in this mix, and over 151 s once before comm_mpi.c slept while it
# waited for a late rank); no job is held to a wall time from its submission. A running
# job fails when it writes nothing (log, metrics) for JOB_STALL seconds: alone these jobs
# write a step every 20-100 ms, and in this mix the longest step took 2 s. A pending job
# waits for the others to free their CPUs, for at most JOB_PENDING seconds.
JOB_STALL = 120
JOB_PENDING = 600
JOB_TIMEOUT = 120      # seconds Slurm itself may take to act on a request (requeue, release)
# A bad config must end the job long before a rank left waiting in a collective would
# (SHARDLM_COMM_TIMEOUT, 600 s): it takes 1-2 s alone, its MPI start-up longer under this mix.
BAD_CONFIG_RUN_LIMIT = 120
# The preempted job must still be training when the test's signal comes, and
# the test's polling can be starved for seconds when the machine is busy: 300
# steps of 48 sequences take about 15 s.
PREEMPT_STEPS, PREEMPT_BATCH = 300, 48
SHORT_STEPS = 20

JOB_ENV = dict(ENV, SHARDLM_HOME=ROOT, SHARDLM_BIN=BIN)
for key in list(JOB_ENV):
    if key.startswith("SLURM_") and key != "SLURM_CONF":
        del JOB_ENV[key]   # not inside an enclosing job's context


def run(cmd, timeout=60, env=None, **kw):
    return subprocess.run(cmd, env=env or JOB_ENV, cwd=TMP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, **kw)


# What Slurm's client commands print when slurmctld did not answer in time.
SLURM_NO_ANSWER = ("socket error", "Socket timed out", "Unable to contact", "Zero Bytes", "Connection refused")
SLURM_PATIENCE = 90    # seconds a client command is retried while slurmctld does not answer


def slurm(*cmd):
    """Runs an idempotent Slurm client command (scontrol, scancel, sinfo), again while
    slurmctld does not answer; a machine busy with I/O held it for over 20 s in CI
    before its state moved to tmpfs. Gives up after SLURM_PATIENCE seconds."""
    deadline = time.time() + SLURM_PATIENCE
    while True:
        try:
            out = run(list(cmd), timeout=30)
            if out.returncode == 0 or not any(e in out.stdout for e in SLURM_NO_ANSWER):
                return out
            why = out.stdout.strip()
        except subprocess.TimeoutExpired:
            why = "no answer within 30 s"
        if time.time() > deadline:
            raise RuntimeError(f"{' '.join(cmd)}: slurmctld did not answer for {SLURM_PATIENCE} s: {why}")
        note(f"{' '.join(cmd)}: {why}; again in 1 s")
        time.sleep(1)


def write_config(name, batch=16, **train):
    """A tiny config whose checkpoints and metrics are named after NAME."""
    cfg = harness.slurm_job_config(TMP, name, SHORT_STEPS, batch)
    cfg["train"].update(train)
    path = os.path.join(TMP, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def small_llama_config(name):
    """The 70B template's own config (input/llama2_70b_finetune.json: Llama, bf16, ZeRO-3, optimizer offload,
    activation checkpointing, WarmupCosineLR) with the model shrunk to a few layers, paths into TMP, and a
    learning rate and schedule that train in 10 steps."""
    with open(os.path.join(ROOT, "input", "llama2_70b_finetune.json")) as f:
        cfg = json.load(f)
    cfg["model"].update({"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "ffn_dim": 160,
                         "n_positions": 64, "vocab_size": 100})
    cfg["data"] = {"train": os.path.join(TMP, "train.bin"), "val": os.path.join(TMP, "train.bin"), "seq_len": 32}
    cfg["train"].update({"steps": 10, "eval_every": 5, "metrics": os.path.join(TMP, f"{name}.metrics.jsonl")})
    cfg["checkpoint"] = {"dir": os.path.join(TMP, f"{name}.ckpt"), "every": 5, "keep": 2}
    cfg["train_batch_size"] = 8
    cfg["train_micro_batch_size_per_gpu"] = 2
    cfg["optimizer"]["params"]["lr"] = 3e-3
    cfg["scheduler"]["params"].update({"total_num_steps": 10, "warmup_num_steps": 2})
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = os.path.join(TMP, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


JOB_METRICS = {}   # job id: [the metrics file of its config]


def sbatch(script, config, *sbatch_opts, env=None):
    out = run(["sbatch", "--parsable", *sbatch_opts, os.path.join(JOBS, script), config], env=env)
    job = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not job.isdigit():
        raise RuntimeError(f"sbatch {script} failed: {out.stdout.strip()}")
    with open(config) as f:
        JOB_METRICS[job] = [json.load(f)["train"]["metrics"]]
    return job


def job_fields(job):
    out = slurm("scontrol", "show", "job", "-o", job).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def job_output(job):
    """The files job JOB writes as it runs: its log (logs/NAME-JOB.out) and its config's metrics."""
    logs = os.path.join(TMP, "logs")
    return [os.path.join(logs, f) for f in os.listdir(logs) if f.endswith(f"-{job}.out")] + JOB_METRICS.get(job, [])


class Silence:
    """How long files have gone unwritten: silent(PATHS) is the seconds since any of PATHS
    last changed (size, mtime, or coming into being) between two calls."""

    def __init__(self):
        self.stamp, self.since = None, time.time()

    def silent(self, paths):
        stamp = []
        for path in paths:
            try:
                st = os.stat(path)
                stamp.append((path, st.st_size, st.st_mtime_ns))
            except OSError:
                pass
        if stamp != self.stamp:
            self.stamp, self.since = stamp, time.time()
        return time.time() - self.since


def wait_job(job, until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
             restarts=None, ready=None):
    """Polls until the job's state is one of UNTIL (and its Restarts equal RESTARTS when given),
    or until READY() is true; returns its fields. Raises when the job ended otherwise, pended
    for JOB_PENDING seconds, or ran JOB_STALL seconds without writing to its log or metrics
    (a hung job; a slow one keeps writing)."""
    pending_since, running = None, Silence()
    while True:
        fields = job_fields(job)
        state = fields.get("JobState")
        if state in until and (restarts is None or fields.get("Restarts") == str(restarts)) or ready and ready():
            return fields
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            raise RuntimeError(f"job {job} ended {state} (exit code {fields.get('ExitCode')}, "
                               f"restarts {fields.get('Restarts')}) instead of reaching {until}")
        if state == "RUNNING":
            pending_since = None
            if running.silent(job_output(job)) > JOB_STALL:
                raise RuntimeError(f"job {job} wrote nothing to its log or metrics for {JOB_STALL} s: {fields}")
        else:
            running = Silence()
            pending_since = pending_since or time.time()
            if time.time() - pending_since > JOB_PENDING:
                raise RuntimeError(f"job {job} {state} for {JOB_PENDING} s: {fields}")
        time.sleep(0.2)


def log_of(job, name="shardlm-cpu"):
    return harness.text_of(os.path.join(TMP, "logs", f"{name}-{job}.out"))


def losses(name):
    """{step: loss} from a metrics file, and the list of steps in file order."""
    rows = []
    with open(os.path.join(TMP, f"{name}.metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                rows.append(row)
    return {r["step"]: r["loss"] for r in rows}, [r["step"] for r in rows]


def check_completed(prefix, fields, log):
    good = fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0"
    check(f"{prefix}.completed", good, f"{fields.get('JobState')} {fields.get('ExitCode')}; log tail: {log[-600:]}")


def check_trained(prefix, name, steps):
    try:
        loss, order = losses(name)
    except OSError as e:
        check(f"{prefix}.trains", False, str(e))
        return
    check(f"{prefix}.trains", order == list(range(1, steps + 1)) and loss[steps] < 0.9 * loss[1],
          f"steps {order[:3]}..{order[-3:]}, loss {loss.get(1)} -> {loss.get(steps)}")


def resolved_config(log):
    """The JSON document the trainer logs after "resolved config:" (None if absent)."""
    m = re.search(r"^resolved config:\n(\{\n.*?\n\})\n", log, re.M | re.S)
    return json.loads(m.group(1)) if m else None


def check_job_log(prefix, log, ntasks, name):
    cfg = resolved_config(log) or {}
    want = {
        "allocation": re.search(rf"^tasks +{ntasks} \(", log, re.M),
        "ranks": f"| {ntasks} ranks |" in log,
        "config": cfg.get("train", {}).get("steps") == SHORT_STEPS
        and cfg.get("gradient_accumulation_steps") == 16 // (2 * ntasks),
        "plan": "memory plan per rank:" in log and "parameter shard" in log,
        "fresh_start": f"no checkpoint in {os.path.join(TMP, name + '.ckpt')}: starting fresh" in log,
    }
    for what, found in want.items():
        check(f"{prefix}.log_{what}", bool(found), f"not in the job log: {log[:1500]}")


def release(job):
    """A requeued job waits for the begin time Slurm gives it (2 min ahead) so that its
    node has finished with the first run: slurmd refuses a launch of the same job within
    the second it revoked its credential ("Job credential revoked", the job FAILS). So:
    wait until the first run's end is processed (Reason=BeginTime), 2 s more, then set the
    begin time to now, again every 2 s while the begin time still holds it (it may then pend
    for CPUs that other jobs hold: wait_job waits for those)."""
    deadline = time.time() + JOB_TIMEOUT
    while job_fields(job).get("Reason") != "BeginTime":
        if time.time() > deadline:
            raise RuntimeError(f"requeued job {job} never waited for its begin time: {job_fields(job)}")
        time.sleep(0.2)
    time.sleep(2)
    while time.time() < deadline:
        slurm("scontrol", "update", f"JobId={job}", "StartTime=now")
        for _ in range(10):
            fields = job_fields(job)
            if fields.get("JobState") != "PENDING" or fields.get("Reason") != "BeginTime":
                return
            time.sleep(0.2)
    raise RuntimeError(f"job {job} still waiting for its begin time {JOB_TIMEOUT} s after its release")


def wait_interactive(proc, metrics):
    """The output of srun process PROC once it exits. Like wait_job, no wall time: it raises when
    the run's METRICS file has not changed for JOB_PENDING seconds before it exists (srun waits
    for CPUs the batch jobs hold, then starts the ranks) or for JOB_STALL seconds after."""
    quiet = Silence()
    while proc.poll() is None:
        silent = quiet.silent([metrics])
        if silent > (JOB_STALL if os.path.exists(metrics) else JOB_PENDING):
            proc.kill()
            raise RuntimeError(f"srun wrote no metrics to {metrics} for {silent:.0f} s")
        time.sleep(0.2)
    return proc.communicate()[0]


def test_preemption(job, reference_job):
    """job and reference_job run the same config 'preempt' / 'uninterrupted'."""
    # Progress is read from the metrics file, which rank 0 flushes every step:
    # the job log comes through srun's I/O forwarding, which may hold lines
    # back for seconds (seen here: a whole run's lines arriving at its end).
    def first_step():
        try:
            return len(losses("preempt")[1]) >= 1
        except (OSError, ValueError):   # not there yet, or a line half written
            return False
    wait_job(job, until=(), ready=first_step)
    sent = slurm("scancel", "-s", "USR1", job)
    note(f"scancel -s USR1 {job}: status {sent.returncode} {sent.stdout.strip()}")
    fields = wait_job(job, until=("PENDING",), restarts=1)
    log = log_of(job)
    m = re.search(r"^step +(\d+) \| stopped by SIGUSR1 after saving a checkpoint", log, re.M)
    check("preempt.stopped_by_usr1", m is not None, f"log tail: {log[-800:]}")
    check("preempt.requeued", fields.get("JobState") == "PENDING" and fields.get("Restarts") == "1"
          and f"requeueing job {job}" in log, f"{fields.get('JobState')} Restarts={fields.get('Restarts')}")
    stop_step = int(m.group(1)) if m else -1
    note(f"stopped at step {stop_step} of {PREEMPT_STEPS}")
    check("preempt.mid_run", 1 <= stop_step < PREEMPT_STEPS, f"stopped at step {stop_step}")
    ckpt_dir = os.path.join(TMP, "preempt.ckpt")
    ckpt = os.path.join(ckpt_dir, f"step_{stop_step:06d}.h5")
    try:
        latest = open(os.path.join(ckpt_dir, "latest")).read().strip()
    except OSError:
        latest = None
    step_attr = None
    if h5py is not None and os.path.exists(ckpt):
        with h5py.File(ckpt, "r") as f:
            step_attr = int(f.attrs["step"])
    check("preempt.checkpoint", step_attr == stop_step and latest is not None
          and os.path.basename(latest) == os.path.basename(ckpt),
          f"{ckpt}: step attribute {step_attr}, latest {latest!r}")

    release(job)
    fields = wait_job(job)
    log = log_of(job)
    check_completed("preempt", fields, log)
    check("preempt.second_run", "run 2 (restart count 1)" in log, f"log: {log[-800:]}")
    check("preempt.resumed_from_checkpoint", f"resumed from {ckpt} at step {stop_step} " in log,
          f"no 'resumed from {ckpt} at step {stop_step}' in the log")
    reference = wait_job(reference_job)
    check_completed("preempt.reference", reference, log_of(reference_job))
    loss, order = losses("preempt")
    ref_loss, _ = losses("uninterrupted")
    check("preempt.metrics_steps", order == list(range(1, PREEMPT_STEPS + 1)), f"steps {order[stop_step - 2:stop_step + 2]}")
    after = [s for s in range(stop_step + 1, PREEMPT_STEPS + 1) if loss.get(s) != ref_loss.get(s)]
    check("preempt.same_losses_after_resume", not after, f"{len(after)} steps differ, first {after[:3]}")
    final, ref_final = loss.get(PREEMPT_STEPS), ref_loss.get(PREEMPT_STEPS)
    check("preempt.same_final_loss", final is not None and final == ref_final,
          f"{loss.get(PREEMPT_STEPS)} vs uninterrupted {ref_loss.get(PREEMPT_STEPS)}")


def test_time_limit(job):
    """A job with --time=1 --signal=USR1@50 that would train for hours: slurmctld itself
    signals the ranks (its timer runs every 30 s, so 10 to 40 s after the start), they save
    and the job requeues. Then it is cancelled (every run would be signalled again)."""
    fields = wait_job(job, until=("PENDING",), restarts=1)
    log = log_of(job)
    slurm("scancel", job)
    m = re.search(r"^step +(\d+) \| stopped by SIGUSR1 after saving a checkpoint", log, re.M)
    check("timelimit.signalled_and_requeued", m is not None and fields.get("Restarts") == "1"
          and f"requeueing job {job}" in log, f"Restarts={fields.get('Restarts')}; log tail: {log[-800:]}")
    ckpt = os.path.join(TMP, "timelimit.ckpt", f"step_{int(m.group(1)) if m else 0:06d}.h5")
    check("timelimit.checkpoint", os.path.exists(ckpt), f"no {ckpt}")


def test_bad_config(job, key):
    fields = wait_job(job)
    log = log_of(job)
    check("badconfig.fails_with_status_2", fields.get("JobState") == "FAILED" and fields.get("ExitCode") == "2:0",
          f"{fields.get('JobState')} {fields.get('ExitCode')}")
    # The ranks agree on the error and the lowest prints it: one intact line in the log.
    lines = [line for line in log.splitlines() if line.startswith("shardlm") and "error" in line]
    check("badconfig.message_in_log", len(lines) == 1 and lines[0].startswith("shardlm: rank 0: error: ")
          and f"unknown key '{key}'" in lines[0] and "not requeued" in log, f"error lines {lines}; log: {log[-800:]}")
    check("badconfig.not_requeued", fields.get("Restarts") == "0", f"Restarts={fields.get('Restarts')}")
    run_time = fields.get("RunTime", "99:99:99")
    h, mnt, s = (int(x) for x in run_time.split("-")[-1].split(":"))
    check("badconfig.fails_fast", h * 3600 + mnt * 60 + s <= BAD_CONFIG_RUN_LIMIT, f"RunTime {run_time}")


def test_requeue_retries():
    """jobs/lib.sh's shardlm_requeue against a fake scontrol that fails its first
    FAILS calls: it must try again (5 tries in all) and report failure only after 5."""
    fake_dir = os.path.join(TMP, "fake-bin")
    os.makedirs(fake_dir, exist_ok=True)
    calls = os.path.join(TMP, "fake-scontrol.calls")
    with open(os.path.join(fake_dir, "scontrol"), "w") as f:
        f.write(f'#!/bin/bash\necho "$*" >>{calls}\n'
                f'[ "$(wc -l <{calls})" -gt "$FAILS" ] || {{ echo "socket error" >&2; exit 1; }}\n')
    os.chmod(os.path.join(fake_dir, "scontrol"), 0o755)
    for fails, want_status, want_calls in ((2, 0, 3), (9, 1, 5)):
        if os.path.exists(calls):
            os.remove(calls)
        env = dict(JOB_ENV, PATH=fake_dir + ":" + JOB_ENV.get("PATH", ""), FAILS=str(fails),
                   SHARDLM_REQUEUE_PAUSE="0.1")
        out = subprocess.run(["bash", "-c", f"source {JOBS}/lib.sh; shardlm_requeue 42"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        with open(calls) as f:
            seen = f.read().split("\n")[:-1]
        check(f"requeue_retry.fails_{fails}", out.returncode == want_status and seen == ["requeue 42"] * want_calls
              and out.stdout.count("failed (try") == min(fails, 4),
              f"status {out.returncode}, calls {seen}: {out.stdout}")


def main():
    test_requeue_retries()
    if os.geteuid() != 0:
        check("cluster.root", False, "t_slurm starts munged, slurmctld and slurmd: run the tests as root")
        return
    start = subprocess.run(["bash", os.path.join(SLURM_TOOLS, "start.sh")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=900)
    sinfo = slurm("sinfo", "-h", "-o", "%T").stdout.strip() if start.returncode == 0 else ""
    check("cluster.starts", start.returncode == 0 and sinfo == "idle",
          f"start.sh status {start.returncode}, node '{sinfo}': {start.stdout[-1500:]}")
    if start.returncode != 0:
        return
    os.makedirs(os.path.join(TMP, "logs"), exist_ok=True)
    write_shard(os.path.join(TMP, "train.bin"), [(i * 7) % 50 for i in range(20000)])

    # The long ones first, so that they run while the others queue.
    timelimit_job = sbatch("cpu.sbatch", write_config("timelimit", steps=10**7), "--ntasks=1", "--time=1",
                           "--signal=USR1@50")
    preempt_cfg = write_config("preempt", PREEMPT_BATCH, steps=PREEMPT_STEPS)
    reference_cfg = write_config("uninterrupted", PREEMPT_BATCH, steps=PREEMPT_STEPS)
    # held after step 1 until the signal comes (SHARDLM_TEST_HOLD_STEP, train.c): it arrives within the run
    preempt_job = sbatch("cpu.sbatch", preempt_cfg, env=dict(JOB_ENV, SHARDLM_TEST_HOLD_STEP="1"))
    reference_job = sbatch("cpu.sbatch", reference_cfg)
    short = {n: sbatch("cpu.sbatch", write_config(f"tasks{n}"), f"--ntasks-per-node={n}") for n in (2, 4)}
    bad_cfg = write_config("bad")
    with open(bad_cfg) as f:
        bad = json.load(f)
    bad["train"]["stepz"] = 10
    with open(bad_cfg, "w") as f:
        json.dump(bad, f)
    bad_job = sbatch("cpu.sbatch", bad_cfg)
    on_cpus = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
    templates = {}
    for script, name in (("gpu-node.sbatch", "shardlm-gpu"), ("gpu-multinode.sbatch", "shardlm-multinode")):
        cfg = write_config(name, steps=10)
        templates[name] = (sbatch(script, cfg, *on_cpus), cfg)
    cfg = small_llama_config("llama2-70b-ft")
    templates["llama2-70b-ft"] = (sbatch("llama2-70b-finetune.sbatch", cfg, *on_cpus), cfg)
    interactive = subprocess.Popen(["bash", os.path.join(JOBS, "srun.sh"), "--ntasks=2", "--",
                                    write_config("srun")], env=JOB_ENV, cwd=TMP, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)

    test_preemption(preempt_job, reference_job)
    for n, job in short.items():
        fields = wait_job(job)
        log = log_of(job)
        check_completed(f"sbatch{n}", fields, log)
        check_job_log(f"sbatch{n}", log, n, f"tasks{n}")
        check_trained(f"sbatch{n}", f"tasks{n}", SHORT_STEPS)
    test_bad_config(bad_job, "train.stepz")
    out = wait_interactive(interactive, os.path.join(TMP, "srun.metrics.jsonl"))
    check("srun.exits_0", interactive.returncode == 0, f"status {interactive.returncode}: {out[-800:]}")
    check("srun.two_ranks", "| 2 ranks |" in out and "resolved config:" in out, out[:800])
    check_trained("srun", "srun", SHORT_STEPS)
    for name, (job, _) in templates.items():
        check_completed(f"templates.{name}", wait_job(job), log_of(job, name))
        check_trained(f"templates.{name}", name, 10)
    test_time_limit(timelimit_job)


def stop_cluster():
    stop = subprocess.run(["bash", os.path.join(SLURM_TOOLS, "stop.sh")], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    left = subprocess.run(["bash", "-c", f"source {SLURM_TOOLS}/common.sh; for d in slurmd slurmctld munged; do "
                           "is_running $PID_DIR/$d.pid $d && echo $d; done"], stdout=subprocess.PIPE, text=True)
    check("cluster.stops", stop.returncode == 0 and not left.stdout.strip(),
          f"stop.sh status {stop.returncode}, still running: {left.stdout.split()} {stop.stdout[-600:]}")


if __name__ == "__main__":
    harness.run_main_with_cluster("t_slurm", main, stop_cluster)
