#!/usr/bin/env python3
"""metrics_to_wandb — a `shardlm train` metrics file (train.metrics) as a Weights & Biases offline run.

    tools/metrics_to_wandb.py METRICS --dir DIR [--project P] [--name N] [--follow] [--idle-timeout S]

Logs each step line's numbers ("train/loss", "train/lr", ...) and each validation line's ("val/loss") at
their step into an offline run under DIR/wandb/ (wandb.init(mode="offline")): nothing is sent, from here or
from the training job. Upload it later with `wandb sync DIR/wandb/offline-run-*`. With --follow it tails a
running job's file and stops once the job's last line (the memory table) has been written, or after
--idle-timeout seconds without a new line.

Runs in build/metrics-venv (tools/deps.sh --test makes it), re-executing itself there when started by another
python3. Bad input is one line on stderr and exit status 2.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metrics_follow import converter_main, records  # noqa: E402


def convert(path, out_dir, project, name, follow, idle_timeout):
    os.environ["WANDB_MODE"] = "offline"  # never online, whatever the user's settings say
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb
    os.makedirs(out_dir, exist_ok=True)
    run = wandb.init(mode="offline", dir=out_dir, project=project, name=name,
                     config={"metrics_file": os.path.abspath(path)})
    steps = 0
    try:
        for step, scalars in records(path, follow, idle_timeout):
            run.log(scalars, step=step)
            steps += 1
    finally:
        run.finish()
    return steps, run.dir


def add_arguments(ap):
    ap.add_argument("--dir", required=True, help="where the offline run is written (DIR/wandb/)")
    ap.add_argument("--project", default="shardlm")
    ap.add_argument("--name", default=None)


def run(args):
    n, run_dir = convert(args.metrics, args.dir, args.project, args.name, args.follow, args.idle_timeout)
    return f"{n} records -> {os.path.dirname(run_dir)} (wandb sync it to upload)"


if __name__ == "__main__":
    converter_main("metrics_to_wandb", __doc__, "wandb", add_arguments, run)
