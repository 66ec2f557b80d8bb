"""toolexit — how shardlm's Python tools end on a signal: SIGTERM (a job's time limit, `kill`), SIGINT (Ctrl-C)
or SIGHUP end the tool with one line naming the signal and status 128 + its number, after removing what the
tool had only begun to write (its hidden temporary file or directory), instead of a Python traceback and a
leftover that nothing would ever remove.

    from toolexit import run_removing_on_signal
    TEMPORARY = []            # paths being written, appended and removed by the tool itself
    run_removing_on_signal("gguf_to_hf", main, TEMPORARY)
"""
import contextlib
import os
import shutil
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """Raised in the main thread by a stop signal (a BaseException: `except Exception` in the tool lets it by)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def remove_quietly(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


@contextlib.contextmanager
def uninterrupted():
    """Holds the stop signals back for a step that must not be cut in half (removing the old output and renaming
    the new one into its place); one that arrives meanwhile is taken at the end."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def fault_point(phase):
    """Test hook: SHARDLM_TOOL_SIGNAL=PHASE:SIG (SIG one of TERM, INT, HUP) sends SIG to this process when the tool
    reaches PHASE, so that a test stops it at a known point instead of at a time it can only hope for."""
    spec = os.environ.get("SHARDLM_TOOL_SIGNAL", "")
    if spec.partition(":")[0] == phase:
        os.kill(os.getpid(), getattr(signal, "SIG" + spec.partition(":")[2]))


def run_removing_on_signal(tool, main, temporary):
    """Runs main(); on SIGTERM, SIGINT or SIGHUP removes every path still in TEMPORARY (a list the tool keeps:
    what it writes under a temporary name before the rename), prints one line and exits 128 + the signal."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopped)
    try:
        main()
    except Stopped as e:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # the clean-up is not itself cut short
        for path in list(temporary):
            remove_quietly(path)
        name = signal.Signals(e.signum).name
        print(f"{tool}: stopped by {name}; nothing written (its temporary files removed)", file=sys.stderr)
        sys.exit(128 + e.signum)
