"""metrics_follow — the records of a `shardlm train` metrics file (train.metrics, JSONL), for the converters
tools/metrics_to_tensorboard.py and tools/metrics_to_wandb.py.

records(path, follow) yields (step, {name: value}) for every step line and validation line, in file order:
the numbers of a step line (loss, lr, grad_norm, tokens_per_s, ms, bytes_*, the loss scale, DPO's rewards,
...) under "train/NAME", a validation line's under "val/NAME" (val_loss as "val/loss"). Lines of another
shape (the sample file's counts, the memory table) carry no step and are skipped. With follow, a file still
being written is tailed: a half-written last line is waited for, and the generator ends when the job's last
line appears (the {"memory": ...} record the trainer writes at the end of a run) and the lines after it (the
NVMe ones) are read, or after `idle_timeout` seconds without a new line (None: wait for ever).

Bad input (a line that is not JSON once complete, a file that does not exist) raises MetricsError.
"""
import json
import os
import time

POLL_SECONDS = 0.5  # how often a followed file is read again
TAIL_SECONDS = 2.0  # after the last line, how long to wait for the lines the trainer writes after it


class MetricsError(Exception):
    pass


def scalars_of(record):
    """(step, {tag: value}) of one metrics record, or None for a record without a step."""
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    val = "val_loss" in record or any(k.startswith("val_") for k in record)
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if val:
            out["val/" + (key[4:] if key.startswith("val_") else key)] = float(value)
        else:
            out["train/" + key] = float(value)
    return step, out


def _lines(path, follow, idle_timeout, state):
    """The file's complete lines; state["saw_last"], set by the caller, starts the final wait."""
    if not os.path.exists(path):
        raise MetricsError(f"{path}: no such file; give the run's train.metrics")
    with open(path, encoding="utf-8") as f:
        pending, last_news, done_at = "", time.monotonic(), None
        while True:
            chunk = f.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending
                    pending, last_news = "", time.monotonic()
                continue
            if not follow:
                if pending.strip():
                    yield pending  # a last line without its newline
                return
            now = time.monotonic()
            if done_at is not None and now - done_at >= TAIL_SECONDS:
                return
            if idle_timeout is not None and now - last_news >= idle_timeout:
                return
            if done_at is None and state["saw_last"]:
                done_at = now
            time.sleep(POLL_SECONDS)


def records(path, follow=False, idle_timeout=None):
    state = {"saw_last": False}
    for n, line in enumerate(_lines(path, follow, idle_timeout, state), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise MetricsError(f"{path}:{n}: not a JSON line ({line.strip()[:60]!r}); give a train.metrics file")
        if not isinstance(record, dict):
            raise MetricsError(f"{path}:{n}: not a JSON object; give a train.metrics file")
        if "memory" in record:
            state["saw_last"] = True  # the job's last record: the follower stops after the lines that follow it
        got = scalars_of(record)
        if got and got[1]:
            yield got


EXIT_BAD_INPUT = 2


def converter_main(tool, doc, module, add_arguments, convert):
    """The command line both converters share: METRICS, the tool's own arguments (add_arguments(parser)),
    --follow and --idle-timeout; runs convert(args) (which returns the line to print) in build/metrics-venv,
    and turns a MetricsError into one line on stderr and exit status 2."""
    import argparse
    import sys
    from toolenv import use_venv
    ap = argparse.ArgumentParser(prog=tool, description=doc.split("\n\n")[0])
    ap.add_argument("metrics")
    add_arguments(ap)
    ap.add_argument("--follow", action="store_true", help="tail a running job until its last line")
    ap.add_argument("--idle-timeout", type=float, default=None, help="with --follow: stop after S s without a line")
    args = ap.parse_args()
    use_venv(tool, sys.argv[0], [module], venvs=("metrics-venv",))
    try:
        print(f"{tool}: {convert(args)}")
    except MetricsError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
