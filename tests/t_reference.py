#!/usr/bin/env python3
"""t_reference — shardlm's GPT-2 training step against an independent PyTorch
reference (written here with torch.nn.functional; no transformers).

Reference precision: the PyTorch model runs in float64 on the float32 weights
that shardlm dumped, so every difference measured is shardlm's fp32 error (or
a bug), not the reference's.

Error measure, per tensor: rel(a, b) = max|a - b| / max(max|b|, 1e-30), where
a is shardlm's value and b the reference's (the max over the whole tensor, so
elements near zero are judged against the tensor's scale).

Checks (one "ok NAME" / "FAIL NAME: why" line each; exit status 1 on failure):
  data.*        the dumped first micro-batch is windows 0..B-1 of the shard
                (inputs tokens[jT : jT+T], targets shifted by one)
  first.*       logits of the first micro-batch (all Vp columns; the padded
                ones must be exactly 0), the loss, every parameter gradient
                (rel <= 1e-4; wte's padded rows exactly 0), params = weights
  sched.lr      the metrics' lr per step = DeepSpeed WarmupLR with the
                off-by-one of src/engine/sched.h (step s runs with it = s - 1)
  clip.*        gradient clipping was active on some step and inactive on
                another (so both branches are compared below)
  train.*       10 steps of torch AdamW + clip_grad_norm_: per-step loss and
                grad norm from the metrics (rel <= 1e-4), final parameters
                (all elements but the key bias, see final_rel)
  accum.*       micro 2 x accumulation 4 vs micro 8 x accumulation 1, 3 steps:
                step-1 gradients, per-step losses, final params (rel <= 1e-5)
  frozen.*      every block frozen (SHARDLM_TEST_FREEZE=blocks), 10 steps with
                clipping active on some steps: loss, grad norm and final params
                against torch with the blocks out of AdamW and of the norm
                (rel <= 1e-4); the blocks bit for bit unchanged

Environment: SHARDLM_BIN (default bin/shardlm under the repo root),
SHARDLM_TEST_TMP (scratch directory; default a fresh temporary directory).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (BIN, ENV, ROOT, arena_round, check, failures, note, read_dump,  # noqa: E402,F401
                     rel, round_up, scratch_dir, write_shard)

TMP = scratch_dir("t_reference")

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

# ---- the tiny model and run ----------------------------------------------------
L, NH, C, NPOS, V = 2, 2, 32, 16, 100
VP = ((V + 127) // 128) * 128  # 128: columns/rows 100..127 are padding
T = 16
B = 4
STEPS = 10
LR_MIN, LR_MAX, WARMUP = 1e-4, 3e-3, 5
BETAS = (0.9, 0.95)
EPS = 1e-8
WD = 0.1
CLIP = 2.15  # the grad norms of this run straddle it (checked by clip.active)
ACCUM_CLIP = 1.0  # every step of the accumulation runs clips
N_WINDOWS = 13  # < STEPS * B, so the run wraps around the shard (k % S)
N_TOKENS = N_WINDOWS * T + 1 + 5  # 5 trailing tokens that make no window

INIT_STD = 0.1  # 5x GPT-2's 0.02: pre-activations of O(1), where e.g. erf vs tanh GELU differ by > 1e-4
TOL_REF = 1e-4
TOL_ACCUM = 1e-5



def check_rel(name, a, b, tol):
    """rel(a, b) <= tol; returns the error (inf on a shape mismatch or NaN)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        check(name, False, f"shape {a.shape} != expected {b.shape}")
        return float("inf")
    e = rel(a, b)
    if not math.isfinite(e):
        e = float("inf")
    check(name, e <= tol, f"rel err {e:.3e} > {tol:.0e}")
    print(f"# {name}: rel err {e:.3e}", flush=True)
    return e


# ---- data ------------------------------------------------------------------------
rng = np.random.default_rng(20240520)
TOKENS = rng.integers(0, V, size=N_TOKENS).astype(np.int64)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)
S = (N_TOKENS - 1) // T
assert S == N_WINDOWS


def batch(first, nb):
    """Samples first .. first+nb-1 in file order: sample k is window k % S."""
    x = np.empty((nb, T), dtype=np.int64)
    y = np.empty((nb, T), dtype=np.int64)
    for i in range(nb):
        w = (first + i) % S
        x[i] = TOKENS[w * T: w * T + T]
        y[i] = TOKENS[w * T + 1: w * T + T + 1]
    return torch.from_numpy(x), torch.from_numpy(y)


# ---- running shardlm ----------------------------------------------------------------
def make_config(name, micro, accum, steps, clip, init_std):
    cfg = {
        "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "n_positions": NPOS, "vocab_size": V,
                  "init_std": init_std},
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 1234, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": LR_MAX, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": LR_MIN, "warmup_max_lr": LR_MAX, "warmup_num_steps": WARMUP,
                                 "warmup_type": "linear"}},
        "gradient_clipping": clip,
        "zero_optimization": {"stage": 0},
    }
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def run_shardlm(name, micro, accum, steps, clip, init_std, freeze=None):
    """Returns (first-step dump, final dump, metrics rows) or None on failure; freeze: SHARDLM_TEST_FREEZE."""
    cfg = make_config(name, micro, accum, steps, clip, init_std)
    dump = os.path.join(TMP, name + ".dump")
    final = os.path.join(TMP, name + ".final")
    for p in (dump, final):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SHARDLM_TEST_FREEZE", None)
    if freeze:
        env["SHARDLM_TEST_FREEZE"] = freeze
    cmd = [BIN, "train", cfg, "--dump", dump, "--dump-final", final, "--quiet"]
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        check(f"run.{name}", False, f"{' '.join(cmd)}: {e}")
        return None
    if r.returncode != 0:
        tail = r.stdout.decode(errors="replace").strip().splitlines()[-5:]
        check(f"run.{name}", False, f"exit status {r.returncode}: {' | '.join(tail)}")
        return None
    rows = []
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if "loss" in row:
                    rows.append(row)
    ok = len(rows) == steps and [r_["step"] for r_ in rows] == list(range(1, steps + 1))
    check(f"run.{name}", ok, f"metrics steps {[r_.get('step') for r_ in rows]}, expected 1..{steps}")
    if not ok:
        return None
    return read_dump(dump), read_dump(final), rows


# ---- the reference model ---------------------------------------------------------------
def param_names():
    names = ["wte.weight", "wpe.weight"]
    for l in range(L):
        for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                  "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                  "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.append(f"h.{l}.{s}")
    return names + ["ln_f.weight", "ln_f.bias"]


NAMES = param_names()


def expected_shape(name):
    if name == "wte.weight":
        return (VP, C)
    if name == "wpe.weight":
        return (NPOS, C)
    if name.endswith("c_attn.weight"):
        return (C, 3 * C)
    if name.endswith("c_attn.bias"):
        return (3 * C,)
    if name.endswith("mlp.c_fc.weight"):
        return (C, 4 * C)
    if name.endswith("mlp.c_fc.bias"):
        return (4 * C,)
    if name.endswith("mlp.c_proj.weight"):
        return (4 * C, C)
    if name.endswith("attn.c_proj.weight"):
        return (C, C)
    return (C,)


def forward(P, x):
    """GPT-2 (HF layout, Conv1D y = x @ W + b); returns logits (B, T, Vp)."""
    nb, t = x.shape
    h = P["wte.weight"][x] + P["wpe.weight"][:t].unsqueeze(0)
    hs = C // NH
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda s: P[f"h.{l}.{s}"]  # noqa: E731
        a = F.layer_norm(h, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        qkv = a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(nb, t, NH, hs).transpose(1, 2)
        k = k.view(nb, t, NH, hs).transpose(1, 2)
        v = v.view(nb, t, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(nb, t, C)
        h = h + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        m = F.layer_norm(h, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        m = F.gelu(m @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        h = h + m @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    h = F.layer_norm(h, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    return h @ P["wte.weight"].t()


def loss_fn(logits, y):
    """Cross-entropy over the real vocabulary only, mean over all tokens."""
    return F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1))


def final_rel(a, b, name):
    """rel() for parameters after training, without the key slice of c_attn.bias.

    The loss does not depend on the key bias (softmax is invariant to adding
    q.b_k to every score of a row), so its gradient is exactly 0 in exact
    arithmetic and rounding noise (~1e-12 here) in fp32; Adam normalises that
    noise into updates of up to lr per step, whose sign is arbitrary. Those
    elements are compared by no implementation; every other element is.
    """
    if name.endswith("attn.c_attn.bias"):
        keep = np.r_[0:C, 2 * C:3 * C]
        return rel(np.asarray(a)[keep], np.asarray(b)[keep])
    return rel(a, b)


def params_from(dump):
    return {n: torch.tensor(dump[n], dtype=torch.float64, requires_grad=True) for n in NAMES}


def sched_lr(step):
    """DeepSpeed WarmupLR, linear: optimizer step s (0-based) runs with it = s - 1."""
    it = step - 1
    if it < 0:
        return LR_MIN
    w = max(2, WARMUP)
    if it < w:
        return LR_MIN + (LR_MAX - LR_MIN) * (it / w)
    return LR_MAX


# ---- 1-3: data path, logits, loss and gradients of the first step ------------------------
def check_first_step(dump):
    missing = [n for n in ["inputs", "targets", "logits", "loss"] + NAMES + ["grad." + n for n in NAMES]
               if n not in dump]
    check("first.dump_complete", not missing, f"missing {missing[:5]}")
    if missing:
        return
    shapes_bad = [(n, dump[n].shape) for n in NAMES if dump[n].shape != expected_shape(n)]
    shapes_bad += [("grad." + n, dump["grad." + n].shape) for n in NAMES
                   if dump["grad." + n].shape != expected_shape(n)]
    check("first.shapes", not shapes_bad, f"{shapes_bad[:4]}")
    if shapes_bad:
        return

    x, y = batch(0, B)
    check("data.inputs", np.array_equal(dump["inputs"], x.numpy().astype(np.float32)),
          f"dumped inputs row 0 {dump['inputs'][0][:6]} != window 0 {x[0][:6].tolist()}")
    check("data.targets", np.array_equal(dump["targets"], y.numpy().astype(np.float32)),
          f"dumped targets row 0 {dump['targets'][0][:6]} != window 0 shifted {y[0][:6].tolist()}")
    check("first.wte_padding_zero", not np.any(dump["wte.weight"][V:]),
          f"wte rows {V}..{VP - 1} hold nonzero values")

    P = params_from(dump)
    logits = forward(P, x)
    loss = loss_fn(logits, y)
    loss.backward()
    check_rel("first.logits", dump["logits"], logits.detach().numpy(), TOL_REF)
    check("first.logits_padding_zero", not np.any(dump["logits"][..., V:]),
          f"max |logit| in padded columns {np.abs(dump['logits'][..., V:]).max():.3e}")
    check_rel("first.loss", dump["loss"], np.array([loss.item()]), TOL_REF)
    worst, worst_name = 0.0, ""
    bad = []
    for n in NAMES:
        e = rel(dump["grad." + n], P[n].grad.numpy())
        if not (e <= TOL_REF):
            bad.append(f"{n} {e:.3e}")
        if not (e <= worst):
            worst, worst_name = e, n
    check("first.grads", not bad, f"rel err > {TOL_REF:.0e}: {', '.join(bad[:6])}")
    print(f"# first.grads: max rel err {worst:.3e} ({worst_name})", flush=True)
    check("first.wte_grad_padding_zero", not np.any(dump["grad.wte.weight"][V:]),
          "gradient of wte's padded rows is nonzero")


# ---- 4: ten AdamW steps ----------------------------------------------------------------
def reference_training(dump, steps, micro, accum, clip, frozen=()):
    """torch AdamW + clip_grad_norm_ from the dumped weights; the tensors named in frozen do not require
    gradients and are left out of the optimizer and the norm, as PEFT freezes a base model."""
    P = params_from(dump)
    for n in frozen:
        P[n].requires_grad_(False)
    trained = [n for n in NAMES if n not in frozen]
    decay = [P[n] for n in trained if P[n].dim() == 2]
    no_decay = [P[n] for n in trained if P[n].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR_MIN, betas=BETAS, eps=EPS)
    losses, norms, lrs = [], [], []
    seen = 0
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for m in range(accum):
            x, y = batch(seen + m * micro, micro)
            loss = loss_fn(forward(P, x), y)
            (loss / accum).backward()
            total += loss.item()
        seen += micro * accum
        norm = torch.nn.utils.clip_grad_norm_([P[n] for n in trained], clip if clip > 0 else float("inf"))
        lr = sched_lr(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(total / accum)
        norms.append(float(norm))
        lrs.append(lr)
    return losses, norms, lrs, {n: P[n].detach().numpy() for n in NAMES}


def check_training(res):
    dump, final, rows = res
    losses, norms, lrs, ref_final = reference_training(dump, STEPS, B, 1, CLIP)
    got_loss = np.array([r["loss"] for r in rows])
    got_norm = np.array([r["grad_norm"] for r in rows])
    got_lr = np.array([r["lr"] for r in rows])
    # lr: the metrics print the fp32 rate with 9 digits
    e = rel(got_lr, np.array(lrs))
    check("sched.lr", e <= 1e-6, f"lr {got_lr.tolist()} != WarmupLR {lrs}")
    print(f"# sched.lr: rel err {e:.3e}", flush=True)
    check("clip.active", any(n > CLIP for n in got_norm) and any(n < CLIP for n in got_norm),
          f"grad norms {got_norm.tolist()} do not straddle the clip {CLIP}: pick another clip value")
    # per-step errors, each step judged on its own scale
    el = max(abs(a - b) / abs(b) for a, b in zip(got_loss, losses))
    check("train.loss", el <= TOL_REF,
          f"max rel err {el:.3e}; shardlm {got_loss.tolist()} torch {[round(v, 7) for v in losses]}")
    print(f"# train.loss: max per-step rel err {el:.3e}", flush=True)
    en = max(abs(a - b) / abs(b) for a, b in zip(got_norm, norms))
    check("train.grad_norm", en <= TOL_REF,
          f"max rel err {en:.3e}; shardlm {got_norm.tolist()} torch {[round(v, 7) for v in norms]}")
    print(f"# train.grad_norm: max per-step rel err {en:.3e}", flush=True)
    ep = {n: final_rel(final[n], ref_final[n], n) for n in NAMES if n in final}
    worst = max(ep, key=ep.get) if ep else "-"
    ok = len(ep) == len(NAMES) and ep[worst] <= TOL_REF
    check("train.final_params", ok, f"worst {worst} rel err {ep.get(worst, float('nan')):.3e} "
          f"({len(ep)}/{len(NAMES)} tensors in the final dump)")
    print(f"# train.final_params: max rel err {ep.get(worst, float('nan')):.3e} ({worst})", flush=True)


# ---- 5: gradient accumulation --------------------------------------------------------------
def check_accumulation():
    # GPT-2's own init (0.02) here: the zero-initialised biases stay small
    # after 3 steps, and Adam turns fp32 reordering noise in their small
    # gradients into relative differences of a few 1e-6 at INIT_STD = 0.1
    a = run_shardlm("accum_2x4", 2, 4, 3, ACCUM_CLIP, 0.02)
    b = run_shardlm("accum_8x1", 8, 1, 3, ACCUM_CLIP, 0.02)
    if a is None or b is None:
        return
    (da, fa, ra), (db, fb, rb) = a, b
    same_init = all(np.array_equal(da[n], db[n]) for n in NAMES)
    check("accum.same_init", same_init, "the two runs start from different weights")
    eg = {n: rel(da["grad." + n], db["grad." + n]) for n in NAMES}
    worst = max(eg, key=eg.get)
    check("accum.grads", eg[worst] <= TOL_ACCUM, f"worst {worst} rel err {eg[worst]:.3e}")
    print(f"# accum.grads: max rel err {eg[worst]:.3e} ({worst})", flush=True)
    la = np.array([r["loss"] for r in ra])
    lb = np.array([r["loss"] for r in rb])
    el = float(np.max(np.abs(la - lb) / np.abs(lb)))
    check("accum.loss", el <= TOL_ACCUM, f"max rel err {el:.3e}: 2x4 {la.tolist()} 8x1 {lb.tolist()}")
    print(f"# accum.loss: max per-step rel err {el:.3e}", flush=True)
    na = np.array([r["grad_norm"] for r in ra])
    nb = np.array([r["grad_norm"] for r in rb])
    en = float(np.max(np.abs(na - nb) / np.abs(nb)))
    check("accum.grad_norm", en <= TOL_ACCUM, f"max rel err {en:.3e}: 2x4 {na.tolist()} 8x1 {nb.tolist()}")
    print(f"# accum.grad_norm: max per-step rel err {en:.3e}", flush=True)
    ep = {n: final_rel(fa[n], fb[n], n) for n in NAMES}
    worst = max(ep, key=ep.get)
    check("accum.final_params", ep[worst] <= TOL_ACCUM, f"worst {worst} rel err {ep[worst]:.3e}")
    print(f"# accum.final_params: max rel err {ep[worst]:.3e} ({worst})", flush=True)
    # the 8x1 step-1 gradient against the reference too: a bug shared by both runs
    # (e.g. the accumulation scaling applied in both) would not show above
    P = params_from(db)
    x, y = batch(0, 8)
    loss_fn(forward(P, x), y).backward()
    e = max(rel(db["grad." + n], P[n].grad.numpy()) for n in NAMES)
    check("accum.grads_vs_reference", e <= TOL_REF, f"max rel err {e:.3e}")
    print(f"# accum.grads_vs_reference: max rel err {e:.3e}", flush=True)


# ---- 6: frozen blocks ----------------------------------------------------------------------------
FROZEN_CLIP = 1.04  # the frozen run's grad norms (embedding and ln_f only) straddle it


def check_frozen():
    """Every block frozen (SHARDLM_TEST_FREEZE=blocks): ten steps against torch with the blocks'
    parameters not requiring gradients (out of AdamW and of clip_grad_norm_)."""
    res = run_shardlm("frozen", B, 1, STEPS, FROZEN_CLIP, INIT_STD, freeze="blocks")
    if res is None:
        return
    dump, final, rows = res
    frozen = [n for n in NAMES if n.startswith("h.")]
    losses, norms, _, ref_final = reference_training(dump, STEPS, B, 1, FROZEN_CLIP, frozen)
    got_loss = [r["loss"] for r in rows]
    got_norm = [r["grad_norm"] for r in rows]
    check("frozen.clip_active", any(n > FROZEN_CLIP for n in got_norm) and any(n < FROZEN_CLIP for n in got_norm),
          f"grad norms {got_norm} do not straddle the clip {FROZEN_CLIP}: pick another clip value")
    el = max(abs(a - b) / abs(b) for a, b in zip(got_loss, losses))
    en = max(abs(a - b) / abs(b) for a, b in zip(got_norm, norms))
    check("frozen.loss", el <= TOL_REF, f"max rel err {el:.3e}; shardlm {got_loss} torch {losses}")
    check("frozen.grad_norm", en <= TOL_REF, f"max rel err {en:.3e}; shardlm {got_norm} torch {norms}")
    ep = {n: final_rel(final[n], ref_final[n], n) for n in NAMES}
    worst = max(ep, key=ep.get)
    check("frozen.final_params", ep[worst] <= TOL_REF, f"worst {worst} rel err {ep[worst]:.3e}")
    same = all(np.array_equal(final[n], dump[n]) for n in frozen)
    check("frozen.blocks_bitwise_unchanged", same, "a frozen block's parameters changed")
    check("frozen.no_block_gradients_dumped", not any("grad." + n in dump for n in frozen),
          "the first-step dump has gradients of frozen tensors")
    print(f"# frozen: loss {el:.2e}, grad norm {en:.2e}, final params {ep[worst]:.2e} ({worst})", flush=True)


def main():
    if not os.access(BIN, os.X_OK):
        check("binary", False, f"{BIN} is not an executable; run 'make all' or set SHARDLM_BIN")
        return
    res = run_shardlm("ref", B, 1, STEPS, CLIP, INIT_STD)
    if res is not None:
        check_first_step(res[0])
        check_training(res)
    check_accumulation()
    check_frozen()


if __name__ == "__main__":
    harness.run_main("t_reference", main)
