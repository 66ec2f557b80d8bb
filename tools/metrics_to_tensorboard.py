#!/usr/bin/env python3
"""metrics_to_tensorboard — a `shardlm train` metrics file (train.metrics) as TensorBoard event files.

    tools/metrics_to_tensorboard.py METRICS --logdir DIR [--follow] [--idle-timeout S]

Writes one scalar per number of each step line ("train/loss", "train/lr", "train/grad_norm",
"train/tokens_per_s", "train/ms", "train/bytes_allgather", ...) and of each validation line ("val/loss"), at
its step, into an event file under DIR, with the tensorboard package's own writer (EventFileWriter); then
`tensorboard --logdir DIR`. With --follow it tails a running job's file and stops once the job's last line
(the memory table) has been written, or after --idle-timeout seconds without a new line.

Runs in build/metrics-venv (tools/deps.sh --test makes it), re-executing itself there when started by another
python3. Bad input is one line on stderr and exit status 2.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metrics_follow import converter_main, records  # noqa: E402


def convert(path, logdir, follow, idle_timeout):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    os.makedirs(logdir, exist_ok=True)
    writer = EventFileWriter(logdir)
    steps = 0
    try:
        for step, scalars in records(path, follow, idle_timeout):
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
            writer.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=values)))
            steps += 1
    finally:
        writer.close()
    return steps, writer.get_logdir()


def add_arguments(ap):
    ap.add_argument("--logdir", required=True)


def run(args):
    n, logdir = convert(args.metrics, args.logdir, args.follow, args.idle_timeout)
    return f"{n} records -> {logdir} (tensorboard --logdir {args.logdir})"


if __name__ == "__main__":
    converter_main("metrics_to_tensorboard", __doc__, "tensorboard", add_arguments, run)
