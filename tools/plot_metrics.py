#!/usr/bin/env python3
"""plot_metrics — a training run's metrics JSONL (train.metrics) as PNG plots.

    tools/plot_metrics.py METRICS.jsonl [-o LOSS.png] [--memory MEMORY.png]

LOSS.png (default: METRICS with .png for its suffix) has, against the step:
the training loss with the validation losses as points, tokens per second, and,
when the run used fp16's loss scaler (a scale other than 1 or a skipped step),
the loss scale with the skipped steps marked, and for a DPO run (steps with
TRL's metrics, issue 37) the rewards of the chosen and rejected completions
with their margin, the reward accuracy and the policy's log-probs. MEMORY.png is a bar chart of the
memory plan against the measured peak of every buffer class, from the run's
last line; a run that did not finish has no such line.

The file is what `shardlm train` writes: one JSON object a line, a step
({"step", "loss", ...}), a validation loss ({"step", "val_loss"}), the sample
file's counts ({"data", ...}) or the memory table ({"memory": {...}}). A run
resumed with --resume appends to the file, so the steps after the checkpoint
appear twice; the later line of a step wins (the run that went on from the
checkpoint). Lines of other shapes, an empty file or one without steps: one
line naming the problem, exit status 2.

Runs with Debian's python3-matplotlib (/usr/bin/python3; tools/deps.sh
installs it). Prints one line per plot: what it holds and where it went.
"""
import argparse
import json
import math
import os
import sys

EXIT_BAD_INPUT = 2
# TRL's DPO metric names (src/engine/dpo.c dpo_metric_names): a step has all of them or none
DPO_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected")
MIB = 1024.0 * 1024.0


def fail(message):
    print("plot_metrics: error: " + message, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Metrics:
    """The lines of a metrics file, a step's later line replacing an earlier one."""

    def __init__(self):
        self.steps = {}  # step -> its record
        self.val = {}  # step -> validation loss
        self.memory = None  # buffer class -> {"space", "planned", "peak"}, from the last memory line
        self.repeated = 0  # step lines that replaced an earlier one (a resumed run)

    def add(self, obj):
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        if "memory" in obj:
            self.add_memory(obj["memory"])
        elif "data" in obj:
            pass  # the sample file's counts: nothing to plot
        elif "val_loss" in obj:
            step = self.step_of(obj)
            if not is_number(obj["val_loss"]):
                raise ValueError(f"val_loss {obj['val_loss']!r} is not a finite number")
            self.val[step] = float(obj["val_loss"])
        elif "loss" in obj:
            step = self.step_of(obj)
            keys = ("loss", "tokens_per_s") + (DPO_KEYS if any(k in obj for k in DPO_KEYS) else ())
            for key in keys:
                if not is_number(obj.get(key)):
                    raise ValueError(f"step {step}: {key} {obj.get(key)!r} is not a finite number")
            self.repeated += step in self.steps
            self.steps[step] = obj
        else:
            raise ValueError("neither a step, a validation loss, the data counts nor the memory table")

    @staticmethod
    def step_of(obj):
        step = obj.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ValueError(f"step {step!r} is not a positive integer")
        return step

    def add_memory(self, table):
        if not isinstance(table, dict) or not table:
            raise ValueError("the memory table is not an object of buffer classes")
        for name, row in table.items():
            if not isinstance(row, dict) or not is_number(row.get("planned")) or not is_number(row.get("peak")):
                raise ValueError(f"memory class {name!r} lacks planned and peak byte counts")
        self.memory = table

    def is_dpo(self):
        return any("rewards/margins" in r for r in self.steps.values())

    def uses_loss_scaler(self):
        return any(r.get("skipped") is True or r.get("loss_scale", 1) != 1 for r in self.steps.values())


def read_metrics(path):
    metrics = Metrics()
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read it ({e}); give the train.metrics file of a run")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            metrics.add(json.loads(line))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            fail(f"{path}:{n}: {e}; this is not a line shardlm train writes to train.metrics (give that file)")
    if not metrics.steps:
        fail(f"{path}: no training steps ({'an empty file' if not lines else 'no line with a step and a loss'}); "
             "give the train.metrics file of a run that trained at least one step")
    return metrics


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        fail(f"matplotlib is missing for {sys.executable}; install Debian's python3-matplotlib (tools/deps.sh does) "
             "and run this with /usr/bin/python3")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def plot_loss(plt, metrics, title, out):
    steps = sorted(metrics.steps)
    rows = [metrics.steps[s] for s in steps]
    scaler = metrics.uses_loss_scaler()
    dpo = metrics.is_dpo()
    panels = 2 + scaler + 3 * dpo
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels + 0.6), sharex=True)
    ax = axes[0]
    ax.plot(steps, [r["loss"] for r in rows], lw=1.2, label="training loss")
    if metrics.val:
        vsteps = sorted(metrics.val)
        ax.plot(vsteps, [metrics.val[s] for s in vsteps], "o-", ms=5, label="validation loss")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax = axes[1]
    ax.plot(steps, [r["tokens_per_s"] for r in rows], lw=1, color="tab:green")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    if scaler:
        ax = axes[2]
        ax.step(steps, [r.get("loss_scale", 1) for r in rows], where="post", color="tab:purple")
        skipped = [s for s in steps if metrics.steps[s].get("skipped") is True]
        if skipped:
            ax.plot(skipped, [metrics.steps[s].get("loss_scale", 1) for s in skipped], "x", color="tab:red",
                    label=f"skipped steps ({len(skipped)})")
            ax.legend()
        ax.set_yscale("log", base=2)
        ax.set_ylabel("loss scale")
        ax.grid(alpha=0.3)
    if dpo:
        plot_dpo(axes[-3:], steps, rows)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    skipped = sum(1 for r in rows if r.get("skipped") is True)
    print(f"plot_metrics: {len(steps)} steps ({steps[0]}..{steps[-1]}; {metrics.repeated} repeated after a resume, "
          f"{skipped} skipped), {len(metrics.val)} validation losses, loss {rows[0]['loss']:.4f} -> "
          f"{rows[-1]['loss']:.4f}{', loss scale' if scaler else ''}{dpo_summary(rows) if dpo else ''} -> {out}")


def plot_dpo(axes, steps, rows):
    """TRL's DPO metrics in three panels: rewards and margin, reward accuracy, the policy's log-probs."""
    dpo_steps = [s for s, r in zip(steps, rows) if "rewards/margins" in r]
    dpo_rows = [r for r in rows if "rewards/margins" in r]
    for ax, keys, label in ((axes[0], ("rewards/chosen", "rewards/rejected", "rewards/margins"), "reward"),
                            (axes[1], ("rewards/accuracies",), "reward accuracy"),
                            (axes[2], ("logps/chosen", "logps/rejected"), "log-prob")):
        for key in keys:
            ax.plot(dpo_steps, [r[key] for r in dpo_rows], lw=1, label=key)
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
    axes[1].set_ylim(-0.05, 1.05)


def dpo_summary(rows):
    dpo_rows = [r for r in rows if "rewards/margins" in r]
    return (f", DPO: reward accuracy {dpo_rows[0]['rewards/accuracies']:.3f} -> {dpo_rows[-1]['rewards/accuracies']:.3f}"
            f", margin {dpo_rows[0]['rewards/margins']:.4f} -> {dpo_rows[-1]['rewards/margins']:.4f}")


def plot_memory(plt, metrics, title, out):
    classes = [(name, row) for name, row in metrics.memory.items() if row["planned"] or row["peak"]]
    names = [f"{name} ({row.get('space', '?')})" for name, row in classes]
    planned = [row["planned"] / MIB for _, row in classes]
    peak = [row["peak"] / MIB for _, row in classes]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(classes) + 1.4))
    ys = range(len(classes))
    height = 0.4
    ax.barh([y - height / 2 for y in ys], planned, height, label="planned")
    ax.barh([y + height / 2 for y in ys], peak, height, label="measured peak")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("MiB per rank")
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    equal = sum(1 for _, row in classes if row["planned"] == row["peak"])
    print(f"plot_metrics: memory of {len(classes)} buffer classes, {equal} with the peak equal to the plan, "
          f"{sum(planned):.2f} MiB planned, {sum(peak):.2f} MiB peak -> {out}")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, like bad input
        fail(f"{message}; see tools/plot_metrics.py --help")


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", metavar="METRICS.jsonl", help="the train.metrics file of a run")
    parser.add_argument("-o", "--output", metavar="LOSS.png", help="the loss plot (default: METRICS.png)")
    parser.add_argument("--memory", metavar="MEMORY.png", help="also the memory plan against the peak")
    args = parser.parse_args()
    out = args.output or os.path.splitext(args.metrics)[0] + ".png"
    metrics = read_metrics(args.metrics)
    if args.memory and metrics.memory is None:
        fail(f"{args.metrics}: no memory table (the last line of a run that finished); plot a finished run's "
             "metrics or leave out --memory")
    plt = import_pyplot()
    title = os.path.basename(os.path.dirname(os.path.abspath(args.metrics))) or args.metrics
    plot_loss(plt, metrics, f"{title}: loss", out)
    if args.memory:
        plot_memory(plt, metrics, f"{title}: memory plan vs measured peak", args.memory)


if __name__ == "__main__":
    main()
