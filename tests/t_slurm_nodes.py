#!/usr/bin/env python3
"""t_slurm_nodes — multi-node jobs (issue 23) on a two-host Slurm cluster that the test
starts with tools/slurm-local/two-hosts.sh: hosts node1 and node2 are network, UTS and
mount namespaces joined by a veth pair (10.213.77.1 <-> .2), a slurmd on each, slurmctld
on node1, a munged of their own. It may run beside t_slurm's single-node cluster (own
config, ports, state, munge socket). Needs root; a cluster that does not start is a
failure, never a skip. The cluster is stopped at the end, also when a check fails or the
test gets SIGTERM.

Model and data as t_slurm's (2 layers, C=64, a period-50 token sequence); LONG_STEPS steps of
32 sequences for the runs that are compared, ZeRO stage 3.

Checks (one "ok NAME" / "FAIL NAME: why" line each; exit status 1 on failure):
  cluster.starts    both nodes idle; each host has its own hostname and one interface
                    besides lo, the veth with its 10.213.77.x address (no route out)
  cross.*           jobs/cpu.sbatch --nodes=2 --ntasks-per-node=2 with Open MPI's
                    btl_base_verbose: COMPLETED; the trainer's rank lines put ranks 0,1 on
                    node1 and 2,3 on node2, node-local ranks 0 and 1 of 2 on each; Open MPI
                    sent between every pair on the same host through vader (shared memory)
                    and between every pair on different hosts through tcp, and every TCP
                    connection went to the peer host's veth address; every loss of all
                    LONG_STEPS steps and every dataset of the final checkpoint (saved by
                    ranks on both hosts) bitwise equal to single.*'s
  single.*          the same config with --nodes=1 --ntasks-per-node=4: COMPLETED, all
                    four ranks on one host (node-local size 4)
  template.*        jobs/gpu-multinode.sbatch with --gpus-per-node=0 --cpus-per-task=1
                    --ntasks-per-node=2 (its own 2 nodes): COMPLETED, the rank lines as cross's, trains
  preempt.*         the cross config again; at its first step scancel -s USR1: "SIGUSR1
                    reached 4 of 4 ranks", "stopped by SIGUSR1" at step S, requeued (PENDING,
                    Restarts=1); released, it resumes from step_S.h5 on both hosts with 4 ranks
                    and every loss after S, the last included, equals cross's bitwise
  shrink.*          a copy of that step_S checkpoint resumed by a 1-node 2-rank job: "saved
                    by 4 ranks, now 2", steps S+1..LONG_STEPS, the first loss within
                    SHRINK_TOLERANCE of cross's at that step (another world size sums in
                    another order)
  lost.*            a 4-rank job with SHARDLM_COMM_TIMEOUT=COMM_TIMEOUT and a checkpoint every
                    5 steps; once one exists, node2 is lost (its link down, then everything on
                    it SIGKILLed): the ranks on node1 are gone within COMM_TIMEOUT +
                    LOSS_MARGIN s, the job log holds exactly one line naming the lost ranks,
                    "lost ranks 2, 3 (host node2)", the job script on node1 ends (once srun
                    gives the lost node's part up) with a failure, not a requeue, and the
                    latest checkpoint resumes (mpirun, 2 ranks, outside the cluster)
  cluster.stops     two-hosts.sh stop: no namespace, veth, mount under its directory,
                    process of the cluster, or Open MPI shared-memory segment of its hosts left

About 2 minutes on the 2-core development machine. Jobs are not held to a wall time while
they share the cores: one fails when it pends or runs for JOB_LIMIT s.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import BIN, ENV, ROOT, alive, check, note, scratch_dir, write_shard  # noqa: E402

try:
    import h5py
    import numpy as np
except ImportError:  # pragma: no cover
    h5py = None

TMP = scratch_dir("t_slurm_nodes")
TWO_HOSTS = os.path.join(ROOT, "tools", "slurm-local", "two-hosts.sh")
JOBS = os.path.join(ROOT, "jobs")
HOST_ADDR = {"node1": "10.213.77.1", "node2": "10.213.77.2"}   # two-hosts.sh's addresses
NETNS = {h: f"shardlm-{h}" for h in HOST_ADDR}
VETH_PREFIX = "shl2h-"
LONG_STEPS, LONG_BATCH = 120, 32
SHORT_STEPS = 10
COMM_TIMEOUT = 20       # SHARDLM_COMM_TIMEOUT of the job whose host is lost
# The survivors notice at COMM_TIMEOUT, ping the peers for 5 s (comm_mpi.c COMM_PROBE_SECONDS)
# and rank 1 waits up to 15 s for rank 0's abort (COMM_REPORT_GRACE_SECONDS); the rest is
# margin for a loaded machine.
LOSS_MARGIN = 60
SRUN_GIVES_UP = 60     # srun waits about 30 s for the step on a node that does not answer
SHRINK_TOLERANCE = 1e-4
JOB_LIMIT = 600
SLURM_PATIENCE = 90

JOB_ENV = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}
JOB_ENV.update(SHARDLM_HOME=ROOT, SHARDLM_BIN=BIN, OMPI_MCA_btl_tcp_if_include="10.213.77.0/24")


def on(host, *cmd, env=None, timeout=60):
    """CMD on HOST (two-hosts.sh run), from TMP; stdout and stderr together."""
    return subprocess.run(["bash", TWO_HOSTS, "run", host, *cmd], env=env or JOB_ENV, cwd=TMP, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


# What Slurm's clients print when slurmctld did not answer in time (as in t_slurm).
NO_ANSWER = ("socket error", "Socket timed out", "Unable to contact", "Zero Bytes", "Connection refused")


def slurm(*cmd):
    """A Slurm client command on node1, again every second while slurmctld does not answer."""
    deadline = time.time() + SLURM_PATIENCE
    while True:
        try:
            out = on("node1", *cmd, timeout=30)
            if out.returncode == 0 or not any(e in out.stdout for e in NO_ANSWER) or time.time() > deadline:
                return out
        except subprocess.TimeoutExpired:
            if time.time() > deadline:
                raise
        time.sleep(1)


def write_config(name, steps=LONG_STEPS, batch=LONG_BATCH, **checkpoint):
    path = os.path.join(TMP, f"{name}.json")
    with open(path, "w") as f:
        json.dump(harness.slurm_job_config(TMP, name, steps, batch, checkpoint), f)
    return path


def sbatch(script, name, *opts, env=None):
    out = on("node1", "sbatch", "--parsable", f"--output=logs/{name}-%j.out", *opts,
             os.path.join(JOBS, script), os.path.join(TMP, f"{name}.json"), env=env)
    job = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not job.isdigit():
        raise RuntimeError(f"sbatch {script} for {name} failed: {out.stdout.strip()}")
    note(f"{name}: job {job}")
    return job


def job_state(job):
    out = slurm("scontrol", "show", "job", "-o", job).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def wait_job(job, until=ENDED, restarts=None, ready=None):
    """Polls until the job is in a state of UNTIL (with RESTARTS restarts when given) or
    READY() holds; raises when it ends otherwise or takes JOB_LIMIT s."""
    deadline = time.time() + JOB_LIMIT
    while time.time() < deadline:
        fields = job_state(job)
        state = fields.get("JobState")
        if (state in until and (restarts is None or fields.get("Restarts") == str(restarts))) or (ready and ready()):
            return fields
        if state in ENDED:
            raise RuntimeError(f"job {job} ended {state} {fields.get('ExitCode')} before reaching {until}")
        time.sleep(0.3)
    raise RuntimeError(f"job {job} did not reach {until} within {JOB_LIMIT} s")


def log_of(name, job):
    return harness.text_of(os.path.join(TMP, "logs", f"{name}-{job}.out"))


def losses(name):
    """{step: loss} of a metrics file and its steps in file order."""
    try:
        with open(os.path.join(TMP, f"{name}.metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if '"loss"' in line]
    except (OSError, ValueError):
        return {}, []
    return {r["step"]: r["loss"] for r in rows}, [r["step"] for r in rows]


def completed(prefix, name, job):
    fields = wait_job(job)
    good = fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0"
    check(f"{prefix}.completed", good,
          f"{fields.get('JobState')} {fields.get('ExitCode')}: {harness.crash_summary(log_of(name, job))}")


RANK_LINE = re.compile(r"^rank (\d+) of (\d+) \| host (\S+) \| pid (\d+) \| node-local rank (\d+) of (\d+)$", re.M)


def rank_table(log):
    """{rank: (host, pid, local rank, local size)} from the trainer's start-up lines."""
    return {int(m[1]): (m[3], int(m[4]), int(m[5]), int(m[6])) for m in RANK_LINE.finditer(log)}


# {rank: (host, node-local rank, node-local size)} of a --nodes=2 --ntasks-per-node=2 job
TWO_BY_TWO = {0: ("node1", 0, 2), 1: ("node1", 1, 2), 2: ("node2", 0, 2), 3: ("node2", 1, 2)}


def check_layout(prefix, log, want):
    """WANT: {rank: (host, local rank, local size)}."""
    got = {r: (h, lr, ls) for r, (h, _, lr, ls) in rank_table(log).items()}
    check(f"{prefix}.ranks", got == want, f"rank lines say {got}, want {want}")


BML = re.compile(r"^\[(\w+):0*(\d+)\] mca: bml: Using (\w+) btl for send to \[\[\d+,\d+\],(\d+)\] on node (\w+)", re.M)
CONNECT = re.compile(r"^\[(\w+):0*(\d+)\] btl: tcp: attempting to connect\(\) to \[\[\d+,\d+\],(\d+)\] address "
                     r"(\S+) on port", re.M)


def check_transports(log):
    """Which BTL Open MPI chose for every ordered pair of ranks (btl_base_verbose's bml lines:
    the sender is [host:pid], mapped to its rank by the trainer's rank lines)."""
    table = rank_table(log)
    rank_of = {(h, pid): r for r, (h, pid, _, _) in table.items()}
    used = {}
    for m in BML.finditer(log):
        src = rank_of.get((m[1], int(m[2])))
        dst = int(m[4])
        if src is not None and src != dst:
            used.setdefault((src, dst), set()).add(m[3])
    host = {r: h for r, (h, _, _, _) in table.items()}
    pairs = [(a, b) for a in host for b in host if a != b]
    same = {p: used.get(p) for p in pairs if host[p[0]] == host[p[1]]}
    other = {p: used.get(p) for p in pairs if host[p[0]] != host[p[1]]}
    check("cross.shm_within_host", len(same) == 4 and all(v == {"vader"} for v in same.values()),
          f"same-host pairs: {same}")
    check("cross.tcp_between_hosts", len(other) == 8 and all(v == {"tcp"} for v in other.values()),
          f"cross-host pairs: {other}")
    wrong = [(m[1], int(m[3]), m[4]) for m in CONNECT.finditer(log)
             if int(m[3]) not in host or m[4] != HOST_ADDR[host[int(m[3])]]]
    connects = len(CONNECT.findall(log))
    check("cross.tcp_on_veth", connects >= 4 and not wrong,
          f"{connects} TCP connections; to another address than the peer's veth: {wrong}")


def checkpoint_datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def latest(name):
    d = os.path.join(TMP, f"{name}.ckpt")
    try:
        with open(os.path.join(d, "latest")) as f:
            return os.path.join(d, f.read().strip())
    except OSError:
        return None


def check_same_run(prefix, name, reference, first_step=1):
    loss, order = losses(name)
    ref, _ = losses(reference)
    differ = [s for s in range(first_step, LONG_STEPS + 1) if loss.get(s) is None or loss.get(s) != ref.get(s)]
    check(f"{prefix}.same_losses", len(ref) == LONG_STEPS and not differ,
          f"{len(differ)} of steps {first_step}..{LONG_STEPS} differ from {reference}'s, first {differ[:3]}")
    return order


def test_cross_and_single(cross, single):
    completed("cross", "cross", cross)
    log = log_of("cross", cross)
    check_layout("cross", log, TWO_BY_TWO)
    check_transports(log)
    completed("single", "single", single)
    table = rank_table(log_of("single", single))
    check("single.one_host", len(table) == 4 and len({h for h, _, _, _ in table.values()}) == 1
          and sorted((lr, ls) for _, _, lr, ls in table.values()) == [(r, 4) for r in range(4)], f"{table}")
    check_same_run("cross", "cross", "single")
    a, b = latest("cross"), latest("single")
    if h5py is None or not a or not b:
        check("cross.same_checkpoint", False, f"h5py {h5py is not None}, checkpoints {a} {b}")
        return
    da, db = checkpoint_datasets(a), checkpoint_datasets(b)
    differ = [n for n in da if n not in db or not np.array_equal(da[n], db[n])]
    check("cross.same_checkpoint", len(da) > 50 and da.keys() == db.keys() and not differ,
          f"{len(da)} datasets; differ: {differ[:5]}")


def test_template(job):
    completed("template", "multinode", job)
    check_layout("template", log_of("multinode", job), TWO_BY_TWO)
    loss, order = losses("multinode")
    check("template.trains", order == list(range(1, SHORT_STEPS + 1)) and loss[SHORT_STEPS] < loss[1],
          f"steps {order}, losses {loss}")


def release(job):
    """A requeued job waits for a begin time 2 min ahead (see t_slurm.release): once it does,
    and 2 s more, its begin time is set to now until it leaves that wait."""
    wait_job(job, until=("PENDING",), ready=lambda: job_state(job).get("Reason") == "BeginTime")
    time.sleep(2)
    deadline = time.time() + 120
    while time.time() < deadline:
        slurm("scontrol", "update", f"JobId={job}", "StartTime=now")
        time.sleep(1)
        fields = job_state(job)
        if fields.get("JobState") != "PENDING" or fields.get("Reason") != "BeginTime":
            return
    raise RuntimeError(f"job {job} still held for its begin time")


def test_preempt_and_shrink(job, cross):
    """JOB runs the config of CROSS, which is compared with it once both have ended."""
    wait_job(job, until=(), ready=lambda: len(losses("preempt")[1]) >= 1)
    slurm("scancel", "-s", "USR1", job)
    fields = wait_job(job, until=("PENDING",), restarts=1)
    log = log_of("preempt", job)
    m = re.search(r"^step +(\d+) \| stopped by SIGUSR1 after saving a checkpoint", log, re.M)
    stop = int(m[1]) if m else -1
    note(f"preempt: stopped at step {stop}")
    check("preempt.all_ranks_signalled", f"step {stop:5d} | SIGUSR1 reached 4 of 4 ranks" in log, log[-800:])
    check("preempt.requeued", 1 <= stop < LONG_STEPS and fields.get("Restarts") == "1"
          and f"requeueing job {job}" in log, f"stopped at {stop}, Restarts={fields.get('Restarts')}: {log[-600:]}")
    ckpt = os.path.join(TMP, "preempt.ckpt", f"step_{stop:06d}.h5")
    # The same checkpoint, resumed by one host with 2 ranks (started now, beside the preempted job's second run).
    shrink_dir = os.path.join(TMP, "shrink.ckpt")
    shutil.copytree(os.path.join(TMP, "preempt.ckpt"), shrink_dir)
    shrink = sbatch("cpu.sbatch", "shrink", "--nodes=1", "--ntasks-per-node=2")

    release(job)
    fields = wait_job(job)
    log = log_of("preempt", job)
    check("preempt.completed", fields.get("JobState") == "COMPLETED" and "run 2 (restart count 1)" in log,
          f"{fields.get('JobState')} {fields.get('ExitCode')}: {log[-600:]}")
    check("preempt.resumed", f"resumed from {ckpt} at step {stop} (saved by 4 ranks, now 4)" in log,
          f"no 'resumed from {ckpt} at step {stop} (saved by 4 ranks, now 4)': {log[-1500:]}")
    wait_job(cross)
    check_same_run("preempt", "preempt", "cross", stop + 1)

    completed("shrink", "shrink", shrink)
    log = log_of("shrink", shrink)
    want = f"resumed from {os.path.join(shrink_dir, os.path.basename(ckpt))} at step {stop} (saved by 4 ranks, now 2)"
    check("shrink.resumed", want in log, f"no '{want}': {log[-1500:]}")
    loss, order = losses("shrink")
    ref, _ = losses("cross")
    first = loss.get(stop + 1)
    close = first is not None and ref.get(stop + 1) and abs(first - ref[stop + 1]) <= SHRINK_TOLERANCE * ref[stop + 1]
    check("shrink.continues", order == list(range(stop + 1, LONG_STEPS + 1)) and bool(close),
          f"steps {order[:3]}..{order[-3:]}, loss at {stop + 1}: {first} vs {ref.get(stop + 1)}")


def shardlm_pids(host):
    pids = []
    out = subprocess.run(["ip", "netns", "pids", NETNS[host]], stdout=subprocess.PIPE, text=True).stdout
    for pid in out.split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "shardlm":
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_lost_host():
    write_config("lost", steps=10**8, batch=16, every=5, keep=2)
    job = sbatch("cpu.sbatch", "lost", "--nodes=2", "--ntasks-per-node=2",
                 env=dict(JOB_ENV, SHARDLM_COMM_TIMEOUT=str(COMM_TIMEOUT)))
    wait_job(job, until=(), ready=lambda: latest("lost") is not None and len(losses("lost")[1]) >= 8)
    lose = subprocess.run(["bash", TWO_HOSTS, "lose", "node2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)
    t_lost = time.time()
    note(f"lost: node2 lost ({lose.stdout.strip()}) after step {losses('lost')[1][-1]}")
    while shardlm_pids("node1") and time.time() - t_lost < COMM_TIMEOUT + LOSS_MARGIN + 30:
        time.sleep(0.5)
    waited = time.time() - t_lost
    left = shardlm_pids("node1")
    note(f"lost: the ranks on node1 ended {waited:.1f} s after node2 was lost")
    check("lost.survivors_end", not left and waited <= COMM_TIMEOUT + LOSS_MARGIN,
          f"after {waited:.0f} s, ranks on node1 {left or 'gone'} (want gone within {COMM_TIMEOUT + LOSS_MARGIN} s)")
    lines, deadline = [], time.time() + 30   # srun forwards the ranks' output when it gets to it
    while not lines and time.time() < deadline:
        lines = [ln for ln in log_of("lost", job).splitlines() if "lost rank" in ln]
        time.sleep(0.5)
    check("lost.one_line", len(lines) == 1 and "lost ranks 2, 3 (host node2), no answer" in lines[0]
          and f"within {COMM_TIMEOUT} s" in lines[0], f"lines naming lost ranks: {lines}")
    # srun gives the unreachable node's step up after its own wait (about 30 s); the batch
    # script on node1 then reports the failure, without a requeue (a lost rank is no preemption).
    deadline = t_lost + COMM_TIMEOUT + LOSS_MARGIN + SRUN_GIVES_UP
    while "| failed (exit status" not in log_of("lost", job) and time.time() < deadline:
        time.sleep(0.5)
    log = log_of("lost", job)
    end = re.search(r"\| failed \(exit status (\d+)\): not requeued", log)
    note(f"lost: the job script ended {time.time() - t_lost:.1f} s after node2 was lost")
    check("lost.job_script_ends", end is not None and end[1] != "3" and "requeueing" not in log, log[-600:])
    path = latest("lost")
    m = re.search(r"step_(\d+)\.h5$", path or "")
    step = int(m[1]) if m else 0
    cfg = write_config("lost", steps=step + 2, batch=16, every=5, keep=2)
    out = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", BIN, "train", cfg, "--resume", "auto"], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    check("lost.checkpoint_loads", out.returncode == 0 and f"resumed from {path} at step {step} " in out.stdout,
          f"status {out.returncode}: {out.stdout[-800:]}")


def start_cluster():
    start = subprocess.run(["bash", TWO_HOSTS, "start"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)
    if start.returncode != 0:
        check("cluster.starts", False, f"two-hosts.sh start: status {start.returncode}: {start.stdout[-1500:]}")
        return False
    nodes = slurm("sinfo", "-h", "-o", "%n=%T").stdout.split()
    views = {}
    for host in HOST_ADDR:
        name = on(host, "hostname").stdout.strip()
        links = on(host, "ip", "-o", "-4", "addr", "show").stdout
        addrs = sorted(re.findall(r"^\d+: (\S+) +inet (\S+)", links, re.M))
        routes = on(host, "ip", "route").stdout.strip()
        views[host] = (name, addrs, routes)
    want = {h: (h, sorted([("lo", "127.0.0.1/8"), (VETH_PREFIX + h[-1], a + "/24")]),
                f"10.213.77.0/24 dev {VETH_PREFIX + h[-1]} proto kernel scope link src {a}") for h, a in HOST_ADDR.items()}
    check("cluster.starts", sorted(nodes) == ["node1=idle", "node2=idle"] and views == want,
          f"nodes {nodes}; hosts {views}, want {want}")
    return True


def cluster_pids():
    pids = set()
    for ns in NETNS.values():
        out = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        pids.update(int(p) for p in out.stdout.split())
    return pids


def stop_cluster():
    before = cluster_pids()
    munged = os.path.join(TWO_HOSTS_DIR, "munge", "munged.pid")
    try:
        with open(munged) as f:
            before.add(int(f.read().strip()))
    except (OSError, ValueError):
        pass
    stop = subprocess.run(["bash", TWO_HOSTS, "stop"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    deadline = time.time() + 15
    while [p for p in before if alive(p)] and time.time() < deadline:
        time.sleep(0.2)
    left = [p for p in before if alive(p)]
    netns = [n for n in subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout.split()
             if n in NETNS.values()]
    links = [ln for ln in subprocess.run(["ip", "-o", "link"], stdout=subprocess.PIPE, text=True).stdout.splitlines()
             if VETH_PREFIX in ln]
    mounts = [ln for ln in subprocess.run(["findmnt", "-rn", "-o", "TARGET"], stdout=subprocess.PIPE,
                                          text=True).stdout.splitlines() if ln.startswith(TWO_HOSTS_DIR + "/")]
    segments = [f for f in os.listdir("/dev/shm") if re.match(r"vader_segment\.node[12]\.", f)]
    check("cluster.stops", stop.returncode == 0 and not (left or netns or links or mounts or segments),
          f"status {stop.returncode}; processes {left}, namespaces {netns}, links {links}, mounts {mounts}, "
          f"shared-memory segments {segments}: "
          f"{stop.stdout[-400:]}")


# two-hosts.sh's state directory (its default: beside the single-node cluster's).
TWO_HOSTS_DIR = os.environ.get("SHARDLM_TWO_HOSTS_DIR") or os.path.join(os.path.dirname(subprocess.run(
    ["bash", "-c", f"source {ROOT}/tools/slurm-local/common.sh; default_slurm_dir"], stdout=subprocess.PIPE,
    text=True).stdout.strip()), "shardlm-two-hosts")


def main():
    if os.geteuid() != 0:
        check("cluster.root", False, "t_slurm_nodes makes namespaces and starts daemons: run the tests as root")
        return
    if not start_cluster():
        return
    os.makedirs(os.path.join(TMP, "logs"), exist_ok=True)
    write_shard(os.path.join(TMP, "train.bin"), [(i * 7) % 50 for i in range(20000)])
    for name in ("cross", "single", "preempt", "shrink"):
        write_config(name)
    write_config("multinode", steps=SHORT_STEPS, batch=16)
    two_by_two = ["--nodes=2", "--ntasks-per-node=2"]
    # held after step 1 until the signal comes (SHARDLM_TEST_HOLD_STEP, train.c): it arrives within the run
    preempt = sbatch("cpu.sbatch", "preempt", *two_by_two, env=dict(JOB_ENV, SHARDLM_TEST_HOLD_STEP="1"))
    cross = sbatch("cpu.sbatch", "cross", *two_by_two, env=dict(JOB_ENV, OMPI_MCA_btl_base_verbose="100"))
    single = sbatch("cpu.sbatch", "single", "--nodes=1", "--ntasks-per-node=4")
    template = sbatch("gpu-multinode.sbatch", "multinode", "--gpus-per-node=0", "--cpus-per-task=1",
                      "--ntasks-per-node=2")
    test_preempt_and_shrink(preempt, cross)
    test_cross_and_single(cross, single)
    test_template(template)
    test_lost_host()


if __name__ == "__main__":
    harness.run_main_with_cluster("t_slurm_nodes", main, stop_cluster)
