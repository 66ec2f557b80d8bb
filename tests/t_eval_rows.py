#!/usr/bin/env python3
"""t_eval_rows — an evaluation forward with targets runs the LM head over the trained rows only (family.c
lm_chunks_trained: DPO's reference, eval loss) and its losses are those of the head over every row, to rounding.

Not bit for bit: sgemm does not promise a row the same sums at another place in the call or in a call of
another length. OpenBLAS's Haswell/Zen kernel (AVX2, e.g. an AMD EPYC) takes the rows 12 at a time, rounds the
two halves of each 12 differently and the last N mod 12 rows in other kernels, and threads split the rows by
N; so a moved row's logits may differ in the last bit (on an AVX-512 Intel the kernel happened to give the
same bits, which the first version of this test assumed). Measured here (Zen, T64): each row's loss within
4.8e-7 (1 ulp) of the pass over every row, a sample's log-prob within 1.5e-6, while the losses of
neighbouring trained rows differ by 1.2e-3 or more, and a row left out by its loss (5.7 or more). So each
sample's log-prob may differ by ROW_TOL per trained target (ROW_TOL = 1e-6, 2 ulp of a loss in [4, 8): at
most 6e-5 here), 20 times under what one row moved to a neighbour's place, given a neighbour's target or left
out would change; the target counts are equal exactly.

SHARDLM_EVAL_LM_ROWS=all runs the head over every row (as before the change); =log runs the trained rows alone
and says how many rows it ran. A tiny Llama (V 1000, so the head's chunk is LOGITS_MIN_ROWS = 256 rows) on
preference pairs whose samples are all T tokens long (prompt untrained, completion trained), so a micro-batch
is exactly 2 B T rows:
  T80.*    4 rows of 80: 320 rows, one chunk of 256 and a last chunk of 64 (computed whole, as before: too short
           to move rows into), the trained rows of the first chunk moved and run padded to 256 rows
  T64.*    8 rows of 64: 512 rows, two chunks; every row may move, the runs cross the chunk boundary
  packed.* T64, 8 pairs a micro-batch, data.packing, samples of 30 tokens (two a row: two runs a row)
Checks, each case:
  CASE.log        the rows the head ran, the count the test expects (the trained rows moved, each chunk
                  of them at least 256 rows, the short last chunk whole); T64, packed: fewer than the
                  micro-batch's rows in some micro-batch (T80 saves nothing: its padded chunk and last chunk
                  are every row)
  CASE.ref        the precomputed reference's log-probs (full fine-tune, 4 micro-batches) with both settings:
                  each within ROW_TOL per target, finite and negative; the target counts equal
  CASE.lora       a LoRA run with the in-step reference (the base with the adapters off, 2 steps), the
                  metrics JSONL with both settings: log-probs within ROW_TOL T, rewards (beta times a log-prob
                  difference) within beta ROW_TOL T, margins and the loss within twice that, the gradient norm
                  within a quarter of that relative (a pair's weight is beta sigmoid(-margin)); the accuracy
                  equal, except at step 1, where the adapters are 0 and every margin is 0 but for the
                  rounding of the reference, whose signs the accuracy would count
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h5py  # noqa: E402
import numpy as np  # noqa: E402

from harness import BIN, ENV, check, run_main, scratch_dir, write_config  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from datafiles import set_str, write_samples  # noqa: E402

TMP = scratch_dir("t_eval_rows")
V = 1000
LLAMA = dict(type="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_dim=48, vocab_size=V, init_std=0.08,
             init_seed=3)
MIN_ROWS = 256
# A row's loss with the head over the trained rows against over every row: 2 ulp of a loss in [4, 8) (sgemm's
# rounding at another place in the call; 1 ulp measured); one row wrong moves a log-prob by 1.2e-3 or more here
ROW_TOL = 1e-6
BETA = 0.1


def write_pref(path, T, n_pairs, rng):
    """n_pairs pairs of T-token samples: a prompt of 5 .. T - 5 untrained tokens, completions trained."""
    toks, tr, off, plens = [], [], [0], []
    for _ in range(n_pairs):
        p = int(rng.integers(5, T - 5)) if T > 10 else 2
        prompt = list(rng.integers(0, V, p))
        for _ in range(2):
            toks += prompt + list(rng.integers(0, V, T - p))
            tr += [0] * p + [1] * (T - p)
            off.append(len(toks))
        plens.append(p)
    write_samples(path, toks, tr, off, V)
    with h5py.File(path, "r+") as f:
        del f.attrs["format"]
        set_str(f, "format", "shardlm-preferences")
        f["prompt_lengths"] = np.array(plens, np.int64)
    return path, plens


def config(name, data, T, micro, lora, packing):
    cfg = {
        "model": dict(LLAMA, n_positions=T),
        "data": {"train": data, "seq_len": T, "shuffle": False, "packing": packing},
        "train": {"steps": 2 if lora else 1, "eval_every": 0, "sample_tokens": 0, "seed": 5,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": micro, "train_micro_batch_size_per_gpu": micro,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 0},
        "dpo": {"beta": BETA, "ref_log_probs_path": os.path.join(TMP, name + ".ref.h5")},
    }
    if lora:
        cfg["lora"] = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    return write_config(os.path.join(TMP, name + ".json"), cfg)


def train(name, path, mode):
    for ext in (".jsonl", ".ref.h5"):
        if os.path.exists(os.path.join(TMP, name + ext)):
            os.remove(os.path.join(TMP, name + ext))
    r = subprocess.run([BIN, "train", path, "--quiet"], env=dict(ENV, SHARDLM_EVAL_LM_ROWS=mode),
                       capture_output=True, text=True, timeout=600)
    check(f"{name}.{mode}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}")
    return r


def metrics(name):
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [x for x in rows if "loss" in x]


def metrics_close(got, want, T):
    """The keys of two runs' metrics lines that differ by more than the rounding of the reference's moved rows
    (module docstring), as 'step: key got want'."""
    tol_logp = ROW_TOL * T
    tol = {"logps/chosen": tol_logp, "logps/rejected": tol_logp, "rewards/chosen": BETA * tol_logp,
           "rewards/rejected": BETA * tol_logp, "rewards/margins": 2 * BETA * tol_logp, "loss": 2 * BETA * tol_logp}
    bad = []
    for step, (g, w) in enumerate(zip(got, want), 1):
        for k, t in tol.items():
            if not (k in g and k in w and abs(g[k] - w[k]) <= t):
                bad.append(f"{step}: {k} {g.get(k)} {w.get(k)}")
        if not abs(g["grad_norm"] - w["grad_norm"]) <= 0.25 * tol["rewards/margins"] * abs(w["grad_norm"]):
            bad.append(f"{step}: grad_norm {g['grad_norm']} {w['grad_norm']}")
        if step > 1 and g.get("rewards/accuracies") != w.get("rewards/accuracies"):
            bad.append(f"{step}: rewards/accuracies {g.get('rewards/accuracies')} {w.get('rewards/accuracies')}")
    return bad


def one_case(case, T, micro, packing, rng):
    # packed: samples of T / 2 - 2 tokens, two a row (two runs of trained rows a row)
    data, plens = write_pref(os.path.join(TMP, case + ".h5"), T // 2 - 2 if packing else T, 4 * micro, rng)
    # the reference: 4 micro-batches of `micro` pairs, rows 2 micro T
    name = case + "_ref"
    path = config(name, data, T, micro, False, packing)
    logged = train(name, path, "log")
    if logged.returncode != 0:
        return
    with h5py.File(os.path.join(TMP, name + ".ref.h5"), "r") as f:
        lp_log, n_log = f["logps"][:], f["n_targets"][:]
    lines = re.findall(r"eval LM head: (\d+) of (\d+) rows \((\d+) trained moved, (\d+) after them\)", logged.stderr)
    if not packing:
        # each micro-batch's rows: targets trained at positions p - 1 .. T - 2 of each row (the last has none)
        rows, want = 2 * micro * T, []
        last = (rows - 1) // MIN_ROWS * MIN_ROWS
        end = last if rows - last < MIN_ROWS else rows
        for m in range(4):
            tgt = np.zeros(rows, bool)
            for k in range(micro):
                p = plens[m * micro + k]
                for lane in range(2):  # chosen rows first, then rejected
                    r0 = (lane * micro + k) * T
                    tgt[r0 + p - 1:r0 + T - 1] = True
            n = int(tgt[:end].sum())
            ran = sum(max(min(MIN_ROWS, n - c0), MIN_ROWS) for c0 in range(0, n, MIN_ROWS)) + rows - end
            want.append((ran, rows, n, rows - end))
        got = [tuple(int(x) for x in ln) for ln in lines]
        check(f"{case}.log", got == want and (T == 80 or any(r < rows for r, *_ in got)), f"got {got}, want {want}")
    else:
        got = [tuple(int(x) for x in ln) for ln in lines]
        check(f"{case}.log", len(got) == 4 and any(r < rows for r, rows, *_ in got), f"got {got}")
    if train(name, path, "all").returncode != 0:
        return
    with h5py.File(os.path.join(TMP, name + ".ref.h5"), "r") as f:
        lp_all, n_all = f["logps"][:], f["n_targets"][:]
    diff = np.abs(lp_log - lp_all)
    check(f"{case}.ref", np.array_equal(n_log, n_all) and np.all(diff <= ROW_TOL * n_all)
          and np.all(np.isfinite(lp_all)) and np.all(lp_all < 0),
          f"max |diff| {np.max(diff):.3e}, per target {np.max(diff / np.maximum(n_all, 1)):.3e} (tolerance "
          f"{ROW_TOL:g}); counts equal {np.array_equal(n_log, n_all)}")
    # LoRA, the reference in each step
    name = case + "_lora"
    path = config(name, data, T, micro, True, packing)
    if train(name, path, "log").returncode != 0:
        return
    got = metrics(name)
    if train(name, path, "all").returncode != 0:
        return
    want = metrics(name)
    bad = metrics_close(got, want, T)
    check(f"{case}.lora", not bad and len(got) == len(want) == 2, f"{len(got)} and {len(want)} lines; {bad}")


def main():
    rng = np.random.default_rng(38)
    one_case("T80", 80, 2, False, rng)
    one_case("T64", 64, 4, False, rng)
    one_case("packed", 64, 8, True, rng)


if __name__ == "__main__":
    run_main("t_eval_rows", main)
