#!/usr/bin/env python3
"""t_metrics_convert — tools/metrics_to_tensorboard.py and tools/metrics_to_wandb.py on metrics files in the
shape `shardlm train` writes (src/run/train.c): step lines, validation lines, the sample file's counts and
the memory table last. Runs where build/metrics-venv exists (tools/deps.sh --test); says skip elsewhere.

Checks:
  tb.scalars       the event file, read back with TensorBoard's own reader (EventAccumulator), holds every
                   number of every step line at its step ("train/loss", "train/lr", ...) and the
                   validation losses ("val/loss"), as float32 of the file's values, and nothing else
  tb.follow        --follow on a file a writer appends to (lines over about 2 s, the last half-written for
                   a while): the converter ends by itself after the memory line, with every step
  wandb.offline    an offline run directory under DIR/wandb/ with its .wandb file, the converter's count
                   of records, and no network (WANDB_MODE offline; the base URL unreachable)
  bad.*            a missing file, a line that is not JSON: one line on stderr, exit status 2
"""
import glob
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, run_main, scratch_dir  # noqa: E402

TMP = scratch_dir("t_metrics_convert")
PY = os.path.join(ROOT, "build", "metrics-venv", "bin", "python")
TB = os.path.join(ROOT, "tools", "metrics_to_tensorboard.py")
WB = os.path.join(ROOT, "tools", "metrics_to_wandb.py")
STEPS = 12


def step_line(step):
    return {"step": step, "loss": 5.0 / step, "lr": 1e-3 * step, "grad_norm": 1.5 + step, "tokens_per_s": 1000.0 + step,
            "ms": 50.0 + step, "bytes_allgather": 1024 * step, "bytes_reduce_scatter": 512, "bytes_allreduce": 0}


def lines():
    out = [{"samples": {"kept": 40, "truncated": 1, "dropped": 0}}]
    for s in range(1, STEPS + 1):
        out.append(step_line(s))
        if s % 4 == 0:
            out.append({"step": s, "val_loss": 4.0 / s})
    out.append({"memory": {"parameter shard": {"space": "device", "planned": 10, "peak": 10}}, "host_rss_peak": [1]})
    return [json.dumps(x) + "\n" for x in out]


def expected():
    want = {}
    for rec in map(json.loads, lines()):
        if "step" not in rec:
            continue
        for k, v in rec.items():
            if k != "step":
                tag = "val/loss" if k == "val_loss" else "train/" + k
                want.setdefault(tag, []).append((rec["step"], float(v)))
    return want


READER = r"""
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
"""


def read_events(logdir):
    r = subprocess.run([PY, "-c", READER, logdir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-300:]}


def same(got, want):
    import struct
    f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]  # noqa: E731  simple_value is a float32
    if set(got) != set(want):
        return f"tags {sorted(got)} != {sorted(want)}"
    for tag, points in want.items():
        if [(s, f32(v)) for s, v in points] != [(s, v) for s, v in got[tag]]:
            return f"{tag}: {got[tag][:3]} != {points[:3]}"
    return ""


def main():
    if not os.path.exists(PY):
        print("skip metrics: no build/metrics-venv (tools/deps.sh --test makes it where PyPI can be reached)")
        return
    metrics = os.path.join(TMP, "metrics.jsonl")
    with open(metrics, "w") as f:
        f.writelines(lines())
    logdir = os.path.join(TMP, "tb")
    r = subprocess.run([sys.executable, TB, metrics, "--logdir", logdir], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    problem = same(read_events(logdir), expected()) if r.returncode == 0 else r.stderr[-300:]
    check("tb.scalars", r.returncode == 0 and not problem, problem)

    # --follow: a writer appends the lines while the converter tails the file
    followed = os.path.join(TMP, "followed.jsonl")
    open(followed, "w").close()
    fdir = os.path.join(TMP, "tb_follow")
    proc = subprocess.Popen([sys.executable, TB, followed, "--logdir", fdir, "--follow", "--idle-timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def writer():
        with open(followed, "a") as f:
            for i, line in enumerate(lines()):
                if i == 5:  # a line written in two pieces, the reader meanwhile at its middle
                    f.write(line[:10])
                    f.flush()
                    time.sleep(0.8)
                    f.write(line[10:])
                else:
                    f.write(line)
                f.flush()
                time.sleep(0.1)
    t = threading.Thread(target=writer)
    start = time.monotonic()
    t.start()
    try:
        out, err = proc.communicate(timeout=50)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    t.join()
    took = time.monotonic() - start
    problem = same(read_events(fdir), expected()) if proc.returncode == 0 else err[-300:]
    check("tb.follow", proc.returncode == 0 and not problem and took < 40, f"{took:.1f} s; {problem}")

    env = dict(os.environ, WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY="", WANDB_MODE="offline")
    wdir = os.path.join(TMP, "wandb_out")
    r = subprocess.run([sys.executable, WB, metrics, "--dir", wdir, "--name", "t_metrics"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=180, env=env)
    runs = glob.glob(os.path.join(wdir, "wandb", "offline-run-*", "run-*.wandb"))
    n_records = STEPS + STEPS // 4
    check("wandb.offline", r.returncode == 0 and len(runs) == 1 and f"{n_records} records" in r.stdout,
          f"exit {r.returncode}; {runs}; {r.stdout[-200:]} {r.stderr[-300:]}")

    for name, path, content in (("missing", os.path.join(TMP, "none.jsonl"), None),
                                ("not_json", os.path.join(TMP, "bad.jsonl"), '{"step": 1, "loss": 2}\nnot json\n')):
        if content is not None:
            with open(path, "w") as f:
                f.write(content)
        r = subprocess.run([sys.executable, TB, path, "--logdir", os.path.join(TMP, "tb_bad")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        lines_err = r.stderr.strip().splitlines()
        check(f"bad.{name}", r.returncode == 2 and len(lines_err) == 1 and path in lines_err[0],
              f"exit {r.returncode}: {r.stderr[-200:]}")


if __name__ == "__main__":
    run_main("metrics_convert", main)
