#!/usr/bin/env python3
"""t_lost_rank — a rank that stops answering, as a lost host's ranks do, on one machine:
rank 2 of 3 freezes itself (SHARDLM_INJECT_SIGNAL=PHASE:STOP, given to that rank only by
an MPMD mpirun line) and the other two must end the job with one line that names it.
tests/t_slurm_nodes.py loses a whole host of a two-host Slurm cluster; this test needs
neither root nor Slurm.

Checks (SHARDLM_COMM_TIMEOUT=5):
  step.*   frozen inside its first step: the others' collective times out; mpirun exits
           non-zero, the first error line is rank 0's "a collective did not finish within
           5 s: lost rank 2 (host HOST), no answer", no error line names another rank as
           lost, and no process of the run is left
  save.*   frozen as the first checkpoint save begins: the others wait inside the save
           (HDF5 over MPI-IO, outside the collective's timeout), the watchdog of the save
           ends it the same way ("saving a checkpoint did not finish within 5 s: lost rank
           2"), and nothing was published (no latest, no step_*.h5)

Each run takes about 12 s alone; a run that has not ended after RUN_LIMIT s fails.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time

import harness
from harness import BIN, ENV, alive, check, note, write_shard

TMP = harness.scratch_dir("lost_rank")
COMM_TIMEOUT = 5
RUN_LIMIT = 180   # the timeout, a 5 s ping and mpirun's teardown, on a loaded machine
LEFT_GRACE = 30   # seconds a killed rank may take to be gone after mpirun returns
HOST = socket.gethostname()


def write_config(name):
    path = os.path.join(TMP, f"{name}.json")
    cfg = harness.slurm_job_config(TMP, name, 100, 12, {"every": 2})
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run_frozen(phase):
    cfg = write_config(phase)
    cmd = ["mpirun", "--oversubscribe", "-np", "2", BIN, "train", cfg, ":",
           "-np", "1", "env", f"SHARDLM_INJECT_SIGNAL={phase}:STOP", BIN, "train", cfg]
    env = dict(ENV, SHARDLM_COMM_TIMEOUT=str(COMM_TIMEOUT))
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        check(f"{phase}.ends", False, f"still running after {RUN_LIMIT} s: {out[-800:]}")
        return None
    pids = [int(m) for m in re.findall(r"^rank \d+ of 3 \| host \S+ \| pid (\d+)", out, re.M)]
    # mpirun may return while the kernel still tears down a rank it killed (a sanitizer build's large mappings
    # take a while): a rank counts as left when it is still there LEFT_GRACE s later
    deadline = time.time() + LEFT_GRACE
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    check(f"{phase}.ends", p.returncode != 0 and len(pids) == 3 and not left,
          f"status {p.returncode}, rank pids {pids}, still alive {left}: {out[-800:]}")
    return out


def check_one_line(phase, out, what):
    errors = [line for line in out.splitlines() if re.match(r"shardlm: rank \d+: (internal )?error", line)]
    want = (f"shardlm: rank 0: internal error: {what} did not finish within {COMM_TIMEOUT} s: lost rank 2 "
            f"(host {HOST}), no answer")
    others = [line for line in errors if "lost rank" in line and "lost rank 2 " not in line]
    check(f"{phase}.names_rank_2", bool(errors) and errors[0].startswith(want) and not others,
          f"error lines {errors}")
    note(f"{phase}: {errors[0] if errors else 'no error line'}")


def main():
    write_shard(os.path.join(TMP, "train.bin"), [(i * 7) % 50 for i in range(20000)])
    out = run_frozen("step")
    if out is not None:
        check_one_line("step", out, "a collective")
    out = run_frozen("save")
    if out is not None:
        check_one_line("save", out, "saving a checkpoint")
        ckpt = os.path.join(TMP, "save.ckpt")
        published = [f for f in os.listdir(ckpt) if f == "latest" or re.match(r"step_\d+\.h5$", f)]
        check("save.nothing_published", not published, f"{ckpt} holds {published}")


if __name__ == "__main__":
    harness.run_main("t_lost_rank", main)
