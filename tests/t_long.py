#!/usr/bin/env python3
"""t_long — memory that grows linearly with the sequence (issue 21).

Chunked LM head and cross-entropy (family.c lm_chunks): the logits, loss and
dlogits of a few rows at a time, folded at once into the LM head's gradient
and the final norm's output gradient, so no buffer of B T V logits exists.
SHARDLM_LOGITS_ROWS forces the chunk (the plan follows it). For an untied
Llama and a GPT-2 (tied: the LM head's gradient is the embedding's), one
training step with --dump and three with --dump-final:
  chunk.KIND.R*        chunks of 7 and 1 rows (not dividing the 64 rows) give
                       the unchunked run's logits, loss and every gradient
                       (rel 1e-6), and its losses over three steps (1e-5)
  chunk.KIND.N2        chunks of 5 at N = 2, ZeRO stage 3: the same (1e-5)
  chunk.KIND.plan      the plan's logits grow with the chunk (rows x padded
                       vocabulary x 4 bytes), and equal the measured peak,
                       class by class
  max_seq.*            plan --max-seq: the length it prints fits with the
                       keys it prints, one token more fits with no setting
  length.T*            one step of a small Llama at T = 512 .. 4096: plan =
                       measured peak, and the activation classes' bytes
                       double when T doubles (the tiled attention keeps O(T))
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, arena_round, check, read_dump, rel, run_main, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("t_long")
V, T, B = 300, 16, 4
TOKENS = np.random.default_rng(3).integers(0, V, 40 * T + 1)
DATA = os.path.join(TMP, "train.bin")
MODELS = {
    "llama": dict(type="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_dim=48, n_positions=64,
                  vocab_size=V, tie_word_embeddings=False, init_seed=5),
    "gpt2": dict(type="gpt2", n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=V, init_seed=5),
}


def train(name, model, rows=None, N=1, stage=0, steps=3):
    cfg = {"model": model, "data": {"train": DATA, "seq_len": T, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_micro_batch_size_per_gpu": B // N, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    path = os.path.join(TMP, name + ".json")
    json.dump(cfg, open(path, "w"))
    dump, final = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    env = dict(ENV)
    env.pop("SHARDLM_LOGITS_ROWS", None)
    if rows:
        env["SHARDLM_LOGITS_ROWS"] = str(rows)
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN, "train", path, "--dump", dump,
                                                                            "--dump-final", final, "--quiet"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stdout[-600:]}")
    if r.returncode != 0:
        return None
    rows_ = [json.loads(x) for x in open(os.path.join(TMP, name + ".jsonl")) if x.strip()]
    return read_dump(dump), read_dump(final), rows_


def same_dumps(name, got, want, tol=1e-6, skip=()):
    keys = [k for k in want if k not in skip]
    bad = [f"{k}: {rel(got[k], want[k]):.2e}" for k in keys if k not in got or rel(got[k], want[k]) > tol]
    check(name, not bad and set(got) == set(want), f"{bad[:4]} keys {sorted(set(got) ^ set(want))[:4]}")


def same_losses(name, got, want, tol=1e-5):
    """The steps' losses (Adam turns the last bits of a near-zero gradient into whole updates, so the parameters
    after several steps are compared through the losses they give)."""
    g, w = [x["loss"] for x in got if "loss" in x], [x["loss"] for x in want if "loss" in x]
    check(name, len(g) == len(w) == 3 and rel(g, w) <= tol, f"{g} vs {w}")


def check_chunks(kind):
    model = MODELS[kind]
    base = train(f"chunk.{kind}.whole", model)
    if not base:
        return
    for rows in (7, 1):
        got = train(f"chunk.{kind}.R{rows}", model, rows=rows)
        if got:
            same_dumps(f"chunk.{kind}.R{rows}.dump", got[0], base[0])
            same_losses(f"chunk.{kind}.R{rows}.losses", got[2], base[2])
    got = train(f"chunk.{kind}.N2", model, rows=5, N=2, stage=3)
    if got:
        # rank 0's micro-batch is half of the step's: its inputs, targets and logits are rank 0's rows
        same_dumps(f"chunk.{kind}.N2.dump", got[0], base[0], 1e-5, skip=("inputs", "targets", "logits"))
        same_losses(f"chunk.{kind}.N2.losses", got[2], base[2])
    # the plan: the logits class holds the final norm's output (B T C, fp32), the chunk's logits and the losses
    mems = {}
    for rows in (7, 14):
        run = train(f"chunk.{kind}.plan{rows}", model, rows=rows, steps=1)
        if run:
            mems[rows] = [x["memory"] for x in run[2] if "memory" in x][-1]
            bad = {k: v for k, v in mems[rows].items() if v["planned"] != v["peak"]}
            check(f"chunk.{kind}.plan{rows}.equals_peak", not bad, f"{bad}")
    if len(mems) == 2:
        Vp = (V + 127) // 128 * 128
        got = mems[14]["logits and loss"]["planned"] - mems[7]["logits and loss"]["planned"]
        want = arena_round(4 * 14 * Vp) - arena_round(4 * 7 * Vp)
        check(f"chunk.{kind}.plan.logits_are_the_chunk", got == want, f"{got} more bytes at 14 rows than at 7, "
              f"want {want}")


LONG_MODEL = dict(type="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_dim=96, n_positions=4096,
                  vocab_size=V, tie_word_embeddings=False, init_seed=5)
ACT_CLASSES = ("activation checkpoints", "block activations", "logits and loss", "workspace")


def check_lengths():
    """One step at T = 512 .. 4096 (micro-batch 1): planned == peak, and the activations' bytes double with T."""
    data = os.path.join(TMP, "long.bin")
    write_shard(data, np.random.default_rng(4).integers(0, V, 2 * 4096 + 1))
    acts = {}
    for T_ in (512, 1024, 2048, 4096):
        cfg = {"model": LONG_MODEL, "data": {"train": data, "seq_len": T_},
               "train": {"steps": 1, "eval_every": 0, "sample_tokens": 0,
                         "metrics": os.path.join(TMP, f"long{T_}.jsonl")},
               "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        path = os.path.join(TMP, f"long{T_}.json")
        json.dump(cfg, open(path, "w"))
        env = dict(ENV)
        env.pop("SHARDLM_LOGITS_ROWS", None)
        r = subprocess.run([BIN, "train", path, "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
        check(f"length.T{T_}.run", r.returncode == 0, f"exit {r.returncode}: {r.stdout[-600:]}")
        if r.returncode != 0:
            continue
        mem = [json.loads(x)["memory"] for x in open(os.path.join(TMP, f"long{T_}.jsonl")) if '"memory"' in x][-1]
        bad = {k: v for k, v in mem.items() if v["planned"] != v["peak"]}
        check(f"length.T{T_}.plan_equals_peak", not bad, f"{bad}")
        acts[T_] = sum(mem[k]["peak"] for k in ACT_CLASSES)
    for T_ in (1024, 2048, 4096):
        if T_ in acts and T_ // 2 in acts:
            ratio = acts[T_] / acts[T_ // 2]
            check(f"length.T{T_}.linear", 1.8 <= ratio <= 2.05,
                  f"activation bytes {acts[T_ // 2]} at T {T_ // 2}, {acts[T_]} at T {T_}: ratio {ratio:.3f}")


def plan_run(args):
    r = subprocess.run([BIN, "plan"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def check_max_seq():
    """plan --max-seq: the length it prints fits with the keys it prints, one token more fits with no setting."""
    base = ["--preset", "llama3-8b", "--ranks", "8", "--gpu-mem", "24GB", "--host-mem", "512GB", "--set",
            "bf16.enabled=true", "--set", "zero_optimization.stage=3", "--set", "model.n_positions=131072",
            "--set", "data.seq_len=1024"]
    rc, out, err = plan_run(base + ["--max-seq"])
    keys = [line.strip().split(" ", 1)[1] for line in out.splitlines() if line.strip().startswith("--set ")]
    T_ = next((int(k.split("=")[1]) for k in keys if k.startswith("data.seq_len=")), None)
    check("max_seq.found", rc == 0 and T_ and 1024 < T_ < 131072, f"exit {rc}: {out[:400]} {err[-300:]}")
    if not T_:
        return
    sets = [a for k in keys for a in ("--set", k)]
    rc, out, err = plan_run(base + sets)
    check("max_seq.fits", rc == 0 and "fits:" in out, f"exit {rc}: {out[-300:]}")
    rc, out, err = plan_run(base + ["--set", f"data.seq_len={T_ + 1}", "--fit"])
    check("max_seq.one_more_does_not", rc != 0 and "nothing fits" in out, f"exit {rc}: {out[-300:]}")
    rc, out, err = plan_run(base + ["--max-seq", "--fit"])
    check("max_seq.bad_with_fit", rc == 2 and "--max-seq" in err, f"exit {rc}: {err[-300:]}")
    rc, out, err = plan_run(base[:4] + ["--max-seq"])
    check("max_seq.bad_without_gpu_mem", rc == 2 and "--gpu-mem" in err, f"exit {rc}: {err[-300:]}")


def main():
    write_shard(DATA, TOKENS)
    for kind in MODELS:
        check_chunks(kind)
    check_max_seq()
    check_lengths()


run_main("long.main", main)
