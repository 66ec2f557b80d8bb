#!/usr/bin/env python3
"""t_plot_metrics — tools/plot_metrics.py on metrics files written here in the
shape `shardlm train` writes (src/run/train.c): step lines, validation lines, the
sample file's counts and the memory table.

Checks:
  plot.val.*       a run with validation lines: the PNG (a real PNG of the
                   two-panel height), the summary's step and validation counts
                   and its first and last loss
  plot.resume.*    steps 1..30, then a resume from step 20 appending 21..40:
                   40 steps, 10 repeated, and every repeated step holds the
                   resumed run's loss (the later line wins)
  plot.fp16.*      loss scale halving at two skipped steps: three panels (the
                   loss scale's), the skipped steps counted
  plot.memory.*    --memory: a PNG and the summary's classes, planned and peak
  bad.*            an empty file, a file of blank lines, a line that is not
                   JSON, an object of another shape, a step without a loss
                   number, --memory without a memory table, a missing file:
                   one line on stderr naming the problem, exit status 2, no PNG
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, run_main, scratch_dir  # noqa: E402

import plot_metrics  # noqa: E402  (tools/, on the path through harness)

TMP = scratch_dir("t_plot_metrics")
TOOL = os.path.join(ROOT, "tools", "plot_metrics.py")
DPI, WIDTH_IN, PANEL_IN, MARGIN_IN = 100, 8, 2.6, 0.6  # plot_loss's figure size


def step_line(step, loss, scale=1.0, skipped=False):
    return {"step": step, "loss": loss, "lr": 1e-3, "grad_norm": 0.0 if skipped else 1.5,
            "tokens_per_s": 1000.0 + step,
            "trained_tokens_per_s": 500.0, "real_tokens": 512, "trained_tokens": 256, "padding": 0.25, "ms": 50.0,
            "loss_scale": scale, "skipped": skipped, "skipped_steps": 0, "bytes_allgather": 100,
            "bytes_reduce_scatter": 50, "bytes_allreduce": 0}


MEMORY = {"memory": {"parameter shard": {"space": "device", "planned": 2 << 20, "peak": 2 << 20},
                     "gradient shard": {"space": "device", "planned": 2 << 20, "peak": 2 << 20},
                     "block activations": {"space": "device", "planned": 30 << 20, "peak": 29 << 20},
                     "Adam m": {"space": "pinned host", "planned": 0, "peak": 0}}}


def write(name, rows):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def run(*args):
    p = subprocess.run(["/usr/bin/python3", TOOL, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def png_size(path):
    """(width, height) from a PNG's IHDR, None when the file is not a PNG."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def panels_height(n):
    return round((PANEL_IN * n + MARGIN_IN) * DPI)


def test_val():
    rows = [{"data": "x.h5", "samples": 10}]
    for s in range(1, 51):
        rows.append(step_line(s, 5.0 - 0.05 * s))
        if s % 10 == 0:
            rows.append({"step": s, "val_loss": 5.2 - 0.05 * s, "val_bytes_allgather": 10})
    path = write("val.jsonl", rows)
    out = os.path.join(TMP, "val.png")
    rc, so, se = run(path, "-o", out)
    check("plot.val.exit", rc == 0, f"rc {rc}: {se}")
    check("plot.val.png", png_size(out) == (WIDTH_IN * DPI, panels_height(2)), f"{png_size(out)}")
    check("plot.val.summary", "50 steps (1..50; 0 repeated after a resume, 0 skipped), 5 validation losses, "
          "loss 4.9500 -> 2.5000" in so, so)
    rc, so, se = run(path)  # default output: beside the metrics
    check("plot.val.default_out", rc == 0 and png_size(os.path.join(TMP, "val.png")) is not None, se)


def test_resume():
    first = [step_line(s, 6.0 - 0.1 * s) for s in range(1, 31)]
    resumed = [step_line(s, 3.0 - 0.01 * s) for s in range(21, 41)]  # the run went on from step 20's checkpoint
    path = write("resume.jsonl", first + [MEMORY] + resumed + [MEMORY])
    out = os.path.join(TMP, "resume.png")
    rc, so, se = run(path, "-o", out)
    check("plot.resume.exit", rc == 0 and png_size(out) is not None, f"rc {rc}: {se}")
    check("plot.resume.summary", "40 steps (1..40; 10 repeated after a resume, 0 skipped)" in so, so)
    metrics = plot_metrics.read_metrics(path)
    wrong = [s for s in range(21, 41) if metrics.steps[s]["loss"] != 3.0 - 0.01 * s]
    check("plot.resume.later_wins", not wrong and metrics.steps[20]["loss"] == 6.0 - 0.1 * 20,
          f"steps holding the first run's loss: {wrong}")


def test_fp16():
    rows, scale = [], 65536.0
    for s in range(1, 31):
        skipped = s in (4, 17)
        rows.append(step_line(s, 4.0 - 0.02 * s, scale, skipped))
        if skipped:
            scale /= 2
    path = write("fp16.jsonl", rows)
    out = os.path.join(TMP, "fp16.png")
    rc, so, se = run(path, "-o", out)
    check("plot.fp16.exit", rc == 0, f"rc {rc}: {se}")
    check("plot.fp16.panels", png_size(out) == (WIDTH_IN * DPI, panels_height(3)), f"{png_size(out)}")
    check("plot.fp16.summary", "30 steps (1..30; 0 repeated after a resume, 2 skipped)" in so and "loss scale" in so,
          so)


def dpo_line(step, loss):
    margin = 0.01 * (step - 1)
    return dict(step_line(step, loss), **{"rewards/chosen": margin / 2, "rewards/rejected": -margin / 2,
                                          "rewards/accuracies": 0.0 if step == 1 else 0.75, "rewards/margins": margin,
                                          "logps/chosen": -40.0 + 0.1 * step, "logps/rejected": -45.0 - 0.1 * step})


def test_dpo():
    path = write("dpo.jsonl", [dpo_line(s, 0.6931 - 0.001 * s) for s in range(1, 21)])
    out = os.path.join(TMP, "dpo.png")
    rc, so, se = run(path, "-o", out)
    check("plot.dpo.exit", rc == 0, f"rc {rc}: {se}")
    check("plot.dpo.panels", png_size(out) == (WIDTH_IN * DPI, panels_height(5)), f"{png_size(out)}")
    check("plot.dpo.summary", "DPO: reward accuracy 0.000 -> 0.750, margin 0.0000 -> 0.1900" in so, so)


def test_memory():
    path = write("memory.jsonl", [step_line(1, 3.0), step_line(2, 2.5), MEMORY])
    out, mem = os.path.join(TMP, "m.png"), os.path.join(TMP, "m_memory.png")
    rc, so, se = run(path, "-o", out, "--memory", mem)
    check("plot.memory.exit", rc == 0 and png_size(mem) is not None, f"rc {rc}: {se}")
    check("plot.memory.summary", "memory of 3 buffer classes, 2 with the peak equal to the plan, 34.00 MiB planned, "
          "33.00 MiB peak" in so, so)


def test_bad():
    cases = [
        ("empty", [], [], "no training steps (an empty file"),
        ("blank", ["", "  "], [], "no training steps"),
        ("not_json", [step_line(1, 3.0), step_line(2, 2.9), '{"step": 3, "loss"'], [], "not_json.jsonl:3:"),
        ("shape", [step_line(1, 3.0), {"hello": 1}], [], "bad_shape.jsonl:2: neither a step"),
        ("loss", [step_line(1, 3.0), dict(step_line(2, 2.0), loss="x")], [], "bad_loss.jsonl:2: step 2: loss 'x'"),
        ("dpo_partial", [dpo_line(1, 0.69), {k: v for k, v in dpo_line(2, 0.68).items() if k != "logps/rejected"}],
         [], "bad_dpo_partial.jsonl:2: step 2: logps/rejected None"),
        ("no_memory", [step_line(1, 3.0)], ["--memory", os.path.join(TMP, "bad_mem.png")], "no memory table"),
    ]
    for name, rows, extra, expect in cases:
        path = write(f"bad_{name}.jsonl", rows)
        out = os.path.join(TMP, f"bad_{name}.png")
        rc, so, se = run(path, "-o", out, *extra)
        lines = se.strip().splitlines()
        check(f"bad.{name}", rc == 2 and len(lines) == 1 and expect in se and not os.path.exists(out),
              f"rc {rc}, stderr {se!r}")
    rc, so, se = run(os.path.join(TMP, "missing.jsonl"))
    check("bad.missing_file", rc == 2 and "cannot read it" in se and len(se.strip().splitlines()) == 1,
          f"rc {rc}, stderr {se!r}")


def main():
    test_val()
    test_resume()
    test_fp16()
    test_dpo()
    test_memory()
    test_bad()


if __name__ == "__main__":
    run_main("plot.crash", main)
