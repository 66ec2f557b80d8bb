"""run_group: a command in its own process group (session), the whole group
killed on a timeout, so that an mpirun stopped at its limit leaves no rank
holding the GPU behind it (issue 35). Used by tests/gpu/e2e.py and
tests/gpu/throughput.py."""
import os
import signal
import subprocess


def run_group(cmd, env, timeout):
    """Runs cmd (stdout and stderr together); returns the CompletedProcess, or None on a timeout,
    after SIGTERM then SIGKILL to every process of its group."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        return None
    return subprocess.CompletedProcess(cmd, p.returncode, out, None)
