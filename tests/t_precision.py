#!/usr/bin/env python3
"""t_precision — mixed precision, the fp16 loss scaler, activation checkpointing,
optimizer offload and the DeepSpeed config, end to end (DESIGN §2, §4-6).

Every multi-rank run goes through `mpirun -np N --oversubscribe bin/shardlm train ...`
(N=1 runs call the binary directly). The data is LEARNABLE: a fixed cycle of 29
distinct tokens (vocab 128), repeated, with 10% of the tokens replaced by random
ones, so the loss falls from ln(128) = 4.85 to about 2 in 50 steps and loss
curves can be compared meaningfully.

Error measure for loss curves: max over the steps of |loss_dtype - loss_fp32| / loss_fp32,
each run against the fp32 run of the same world size and stage (same data, same init).

Checks (one "ok NAME" / "FAIL NAME: why" line each; exit status 1 on failure):
  prec.*     fp16 and bf16 vs fp32, 50 steps (WarmupLR linear over 10 steps), N=1 stage 0
             and N=2 stage 3: the fp32 curve falls; the half-precision curves track it
             within TOL_FP16 / TOL_BF16 (and differ from it: the dtype is in effect); no
             fp16 step overflows; the memory line's "fp32 master weights" is Psi_opt x 4
             bytes and "parameter shard" Psi_shard x 2 bytes (computed per unit here),
             planned == peak; the final parameters (--dump-final) are exactly
             representable in the half dtype (the fp32 run's are not: the check has teeth)
  scaler.*   fp16 N=2 stage 3 with SHARDLM_INJECT_INF_STEP=3 (rank 0's gradients inf at
             step 3): hysteresis 2 -> only step 3 skipped, skipped_steps 0,0,1,1..., scale
             stays 65536; hysteresis 1 -> scale 65536 until step 2, 32768 from step 3;
             both: the lr sequence is the uninjected run's with step 3's value repeated
             (the scheduler does not advance on the skipped step), steps 1-3 have the
             uninjected run's losses, final loss finite; initial_scale_power 4 with
             min_loss_scale 16 and hysteresis 1: exit status 2, the error names the
             minimum, no metrics after step 2
  ckpt.*     6 layers, activation checkpointing off / interval 1, 2, 3, 4 (uneven
             segments) / 2 with cpu_checkpointing, at N=1 stage 0 (fp32), N=2 stage 3
             (fp32 and bf16): first-step logits, loss and every grad.* tensor (--dump),
             per-step losses and final parameters are bitwise identical to the run
             without checkpointing; "activation checkpoints" and "block activations"
             planned == peak == gpt2_plan's formulas computed here; with
             checkpointing their sum is below the sum without; cpu_checkpointing puts
             "activation checkpoints" in "pinned host" and the device total shrinks by
             exactly those bytes
  offload.*  N=2, stages 1-3, fp32 and bf16, offload_optimizer cpu vs none (8 steps,
             accumulation 2): final parameters bitwise equal, per-step losses and grad
             norms equal; fp32 master weights, Adam m, Adam v, fp32 gradient shard in
             "pinned host" when offloaded, "device" otherwise; every other class keeps
             its space and bytes; bf16: the device total shrinks by exactly the four
             classes' bytes; fp32 has no device master or fp32 gradient shard to move:
             offload creates them in pinned host (master = Adam m's bytes, fp32 gradient
             shard = the gradient shard's), and at stages 2-3 offload takes zero.c's
             master-copy path, which reshapes the full-unit gradient pools (fewer unit
             gradient buffers, plus gradient send buffers; the device gradient shard becomes
             the one receive buffer of the reduce-scatters), so the device total shrinks
             by Adam m + Adam v - the growth of those classes
  bad.*      exit status 2 and one stderr line naming the key: fp16 and bf16 both
             enabled; fp16.loss_scale_window 0; activation_checkpointing.interval 0 and
             > n_layer; offload_optimizer.device "nvme" without nvme_path
  ds.*       input/ds_config.json, unmodified, with a tiny model config (--deepspeed,
             --set train.steps): N=2 trains in fp16 at stage 3 with the optimizer state
             in pinned host, finite losses; a copy with "reduce_bucket_size": 5e8 and
             "contiguous_gradients": true under zero_optimization prints exactly one
             warning line for each of the two keys on stderr

Tolerances (measured on this machine with the data and models below, 50 steps):
  max rel loss error  N=1 stage 0   N=2 stage 3
  fp16                6.3e-05       1.6e-04      -> TOL_FP16 = 2e-3  (12x margin)
  bf16                6.6e-04       1.9e-03      -> TOL_BF16 = 1e-2  (5x margin)

Environment: SHARDLM_BIN (default bin/shardlm under the repo root),
SHARDLM_TEST_TMP (scratch directory; default a fresh temporary directory).
"""
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (BIN, ENV, ROOT, arena_round, check, failures, note, read_dump,  # noqa: E402,F401
                     rel, round_up, scratch_dir, write_shard)

TMP = scratch_dir("t_precision")


TOL_FP16 = 2e-3
TOL_BF16 = 1e-2
ALIGN = 16  # MODEL_TENSOR_ALIGN (src/model/model.h)



# ---- sizes (src/model/model.c, src/zero/zero.c, src/backend/arena.h, src/families/gpt2.c) ------------------------------------
def unit_numels(L, C, V, npos):
    """Elements of each unit (embedding, blocks, head) as model.c lays them out (tensors aligned to 16)."""
    Vp = round_up(V, 128)

    def unit(sizes):
        n = 0
        for s in sizes:
            n = round_up(n, ALIGN) + s
        return round_up(n, ALIGN)

    block = unit([C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C])
    return [unit([Vp * C, npos * C])] + [block] * L + [unit([C, C])]


def shard_elems(numels, N):
    """Per unit: the shard of one rank (padded to N*16, split N ways)."""
    return [round_up(n, N * ALIGN) // N for n in numels]


def f32(n):
    return arena_round(4 * n)


def expected_act_bytes(L, B, T, C, NH, interval):
    """(activation checkpoints, block activations) bytes, gpt2.c's gpt2_plan; attention keeps each row's
    log-sum-exp (B NH T fp32: the CPU backend's tiled kernel, the default)."""
    BT = B * T
    block_set = (f32(BT * C) + 2 * f32(BT) + f32(BT * 3 * C) + f32(B * NH * T) + f32(BT * C) + f32(BT * C)
                 + f32(BT * C) + 2 * f32(BT) + 2 * f32(BT * 4 * C))
    if interval > 0:
        segments = (L + interval - 1) // interval
        return segments * f32(BT * C), interval * block_set + (interval + 1) * f32(BT * C) + f32(BT * C)
    return L * f32(BT * C), L * block_set + f32(BT * C)


# ---- data -------------------------------------------------------------------------------------
V = 128
T = 16
N_WINDOWS = 400


def learnable_tokens(n, seed=7, period=29, noise=0.1):
    rng = np.random.default_rng(seed)
    cycle = rng.permutation(V)[:period]
    tok = np.tile(cycle, n // period + 1)[:n].copy()
    flip = rng.random(n) < noise
    tok[flip] = rng.integers(0, V, size=int(flip.sum()))
    return tok


DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, learnable_tokens(N_WINDOWS * T + 1))

SMALL = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": T, "vocab_size": V}
DEEP = dict(SMALL, n_layer=6)
LR_MIN, LR_MAX, WARMUP = 1e-4, 3e-3, 10


def merge(dst, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


def make_config(name, model=SMALL, steps=50, stage=0, micro=4, accum=1, dtype="fp32", extra=None):
    cfg = {
        "model": dict(model),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 1234, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR_MAX, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": LR_MIN, "warmup_max_lr": LR_MAX,
                                                     "warmup_num_steps": WARMUP, "warmup_type": "linear"}},
        # threshold 0: every unit sharded at stage 3 (the default 1e5 would keep these tiny units whole)
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if extra:
        merge(cfg, extra)
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return path


# ---- runs -------------------------------------------------------------------------------------
class Run:
    def __init__(self, name, rc, out, err, rows, memory, dump, final):
        self.name, self.rc, self.out, self.err = name, rc, out, err
        self.rows, self.memory, self.dump, self.final = rows, memory, dump, final

    def losses(self):
        return [r["loss"] for r in self.rows]

    def col(self, key):
        return [r.get(key) for r in self.rows]

    def planned(self, cls):
        return self.memory[cls]["planned"]

    def space_total(self, space):
        return sum(v["planned"] for v in self.memory.values() if v["space"] == space)


def launch(name, N, cfg, args=(), env_extra=None, timeout=120):
    """Runs shardlm train; returns (rc, stdout, stderr) with stdout and stderr kept apart."""
    cmd = ([BIN] if N == 1 else ["mpirun", "-np", str(N), "--oversubscribe", BIN]) + ["train", cfg, "--quiet"]
    cmd += list(args)
    env = dict(ENV, **(env_extra or {}))
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", f"{' '.join(cmd)}: {e}"
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    with open(os.path.join(TMP, name + ".out"), "w") as f:
        f.write(out + "\n---- stderr ----\n" + err)
    return r.returncode, out, err


def run(name, N, cfg, steps, dump=False, final=True, args=(), env_extra=None, want_rc=0):
    """Runs and reads its metrics and dumps; checks run.NAME (exit status, a metrics row for every
    step, a memory line) and returns a Run, or None when it failed."""
    mpath = os.path.join(TMP, name + ".jsonl")
    dpath, fpath = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    for p in (mpath, dpath, fpath):
        if os.path.exists(p):
            os.remove(p)
    extra = list(args) + (["--dump", dpath] if dump else []) + (["--dump-final", fpath] if final else [])
    rc, out, err = launch(name, N, cfg, extra, env_extra)
    rows, memory = [], None
    if os.path.exists(mpath):
        with open(mpath) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in lines if "loss" in r]
        memory = next((r["memory"] for r in lines if "memory" in r), None)
    if want_rc != 0:
        return Run(name, rc, out, err, rows, memory, None, None)
    if rc != 0:
        tail = (out + err).strip().splitlines()[-5:]
        check(f"run.{name}", False, f"exit status {rc}: {' | '.join(tail)}")
        return None
    if [r.get("step") for r in rows] != list(range(1, steps + 1)) or memory is None:
        check(f"run.{name}", False, f"metrics steps {[r.get('step') for r in rows]}, expected 1..{steps}; "
              f"memory line {'present' if memory else 'missing'}")
        return None
    return Run(name, rc, out, err, rows, memory, read_dump(dpath) if dump else None,
               read_dump(fpath) if final else None)


def max_rel_curve(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not a.size:
        return float("inf")
    e = float(np.max(np.abs(a - b) / np.abs(b)))
    return e if math.isfinite(e) else float("inf")


def params_equal(a, b):
    """'' when the two dumps hold the same tensors bitwise, else what differs."""
    if a is None or b is None:
        return "dump missing"
    if sorted(a) != sorted(b):
        return f"tensor names differ: {sorted(set(a) ^ set(b))[:4]}"
    bad = [n for n in a if a[n].shape != b[n].shape or a[n].view(np.uint32).tobytes() != b[n].view(np.uint32).tobytes()]
    if bad:
        n = bad[0]
        d = float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) if a[n].shape == b[n].shape else float("nan")
        return f"{len(bad)} tensors differ, e.g. {n} (max |diff| {d:.3e})"
    return ""


def not_representable(params, dtype):
    """Names of tensors whose float32 values do not round-trip through the half dtype."""
    bad = []
    for n, a in params.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "fp16":
            with np.errstate(over="ignore"):
                rt = a.astype(np.float16).astype(np.float32)
            ok = np.all(np.isfinite(a)) and np.array_equal(rt.view(np.uint32), a.view(np.uint32))
        else:  # bf16 is the top half of a float32
            ok = np.all(np.isfinite(a)) and not np.any(a.view(np.uint32) & 0xFFFF)
        if not ok:
            bad.append(n)
    return bad


# ---- 1. precision -------------------------------------------------------------------------------
PREC_STEPS = 50
PREC_SETUPS = [(1, 0), (2, 3)]


def precision_suite():
    runs = {}
    for N, stage in PREC_SETUPS:
        for dt in ("fp32", "fp16", "bf16"):
            name = f"prec_n{N}s{stage}_{dt}"
            runs[(N, stage, dt)] = run(name, N, make_config(name, steps=PREC_STEPS, stage=stage, dtype=dt),
                                       PREC_STEPS)
    numels = unit_numels(SMALL["n_layer"], SMALL["n_embd"], V, T)
    for N, stage in PREC_SETUPS:
        tag = f"n{N}s{stage}"
        base = runs[(N, stage, "fp32")]
        if base is None:
            continue
        b = base.losses()
        first, last5 = b[0], float(np.mean(b[-5:]))
        check(f"prec.{tag}.fp32_learns", last5 < 0.6 * first,
              f"fp32 loss {first:.4f} at step 1, mean of the last 5 steps {last5:.4f} (want < 0.6x)")
        note(f"{tag} fp32 loss: step 1 {first:.4f}, mean of steps 46-50 {last5:.4f}")
        # the opt range: the shard at stages 1-3, everything at stage 0; parameters: shard at stage 3
        opt = shard_elems(numels, N) if stage > 0 else [round_up(n, N * ALIGN) for n in numels]
        par = shard_elems(numels, N) if stage == 3 else [round_up(n, N * ALIGN) for n in numels]
        if not_representable(base.final, "fp16") == [] or not_representable(base.final, "bf16") == []:
            check(f"prec.{tag}.fp32_params_not_half", False, "every fp32 parameter is representable in a half "
                  "dtype: the representability check below would prove nothing")
        for dt, tol in (("fp16", TOL_FP16), ("bf16", TOL_BF16)):
            r = runs[(N, stage, dt)]
            if r is None:
                continue
            e = max_rel_curve(r.losses(), b)
            check(f"prec.{tag}.{dt}_tracks_fp32", e <= tol, f"max rel loss error {e:.3e} > {tol:.0e}")
            check(f"prec.{tag}.{dt}_in_effect", e > 0, "the loss curve is bitwise the fp32 one")
            note(f"{tag} {dt}: max rel loss error vs fp32 over {PREC_STEPS} steps {e:.3e} (tolerance {tol:.0e}); "
                 f"last loss {r.losses()[-1]:.4f} vs fp32 {b[-1]:.4f}")
            if dt == "fp16":
                check(f"prec.{tag}.fp16_no_overflow", not any(r.col("skipped")) and set(r.col("loss_scale")) ==
                      {65536}, f"skipped {r.col('skipped').count(True)} steps, scales {sorted(set(r.col('loss_scale')))}")
            want_master = sum(arena_round(4 * s) for s in opt)
            want_params = sum(arena_round(2 * s) for s in par)
            m, p = r.memory.get("fp32 master weights", {}), r.memory.get("parameter shard", {})
            check(f"prec.{tag}.{dt}_master_fp32",
                  m.get("planned") == want_master and m.get("peak") == want_master,
                  f"fp32 master weights planned {m.get('planned')} peak {m.get('peak')}, want {want_master} "
                  f"(= sum of 4 x {opt} rounded to 64)")
            check(f"prec.{tag}.{dt}_params_half",
                  p.get("planned") == want_params and p.get("peak") == want_params,
                  f"parameter shard planned {p.get('planned')} peak {p.get('peak')}, want {want_params} "
                  f"(= sum of 2 x {par} rounded to 64)")
            bad = not_representable(r.final, dt)
            check(f"prec.{tag}.{dt}_final_params_representable", not bad,
                  f"{len(bad)} tensors hold values not representable in {dt}, e.g. {bad[:3]}")
        fm = base.memory.get("fp32 master weights", {}).get("planned")
        check(f"prec.{tag}.fp32_no_master", fm == 0, f"fp32 without offload plans {fm} bytes of master weights")
    return runs


# ---- 2. the loss scaler ------------------------------------------------------------------------
SCALER_STEPS = 12
INJECT = 3


def scaler_suite(prec_runs):
    base = prec_runs.get((2, 3, "fp16"))
    if base is None:
        check("scaler.base", False, "the uninjected fp16 N=2 stage-3 run failed")
        return
    base_lr = base.col("lr")[:SCALER_STEPS]
    want_lr = base_lr[:INJECT] + [base_lr[INJECT - 1]] + base_lr[INJECT:SCALER_STEPS - 1]
    env = {"SHARDLM_INJECT_INF_STEP": str(INJECT)}
    for hyst, scale_after in ((2, 65536), (1, 32768)):
        name = f"scaler_h{hyst}"
        cfg = make_config(name, steps=SCALER_STEPS, stage=3, dtype="fp16", extra={"fp16": {"hysteresis": hyst}})
        r = run(name, 2, cfg, SCALER_STEPS, final=False, env_extra=env)
        if r is None:
            continue
        skipped = r.col("skipped")
        check(f"scaler.h{hyst}.skips_step_{INJECT}", skipped == [s == INJECT for s in range(1, SCALER_STEPS + 1)],
              f"skipped flags {skipped}")
        want_count = [0 if s < INJECT else 1 for s in range(1, SCALER_STEPS + 1)]
        check(f"scaler.h{hyst}.skipped_steps", r.col("skipped_steps") == want_count,
              f"skipped_steps {r.col('skipped_steps')}, want {want_count}")
        want_scale = [65536 if s < INJECT else scale_after for s in range(1, SCALER_STEPS + 1)]
        check(f"scaler.h{hyst}.loss_scale", r.col("loss_scale") == want_scale,
              f"loss_scale {r.col('loss_scale')}, want {want_scale}")
        check(f"scaler.h{hyst}.lr_not_advanced", r.col("lr") == want_lr,
              f"lr {r.col('lr')}, want the uninjected {base_lr} with step {INJECT}'s value repeated")
        check(f"scaler.h{hyst}.same_until_skip", r.losses()[:INJECT] == base.losses()[:INJECT],
              f"losses of steps 1-{INJECT} {r.losses()[:INJECT]} vs uninjected {base.losses()[:INJECT]}")
        fin = r.losses()[-1]
        falls = r.losses()[-1] < r.losses()[0]
        check(f"scaler.h{hyst}.continues", math.isfinite(fin) and falls and
              all(math.isfinite(x) for x in r.col("grad_norm")),
              f"final loss {fin} (step 1: {r.losses()[0]}), grad norms {r.col('grad_norm')}")
        note(f"scaler h{hyst}: scales {sorted(set(r.col('loss_scale')))}, final loss {fin:.4f}")
    # the scale already at its minimum: the run stops with an error instead of training on inf
    name = "scaler_min"
    cfg = make_config(name, steps=SCALER_STEPS, stage=3, dtype="fp16",
                      extra={"fp16": {"hysteresis": 1, "initial_scale_power": 4, "min_loss_scale": 16}})
    r = run(name, 2, cfg, SCALER_STEPS, final=False, env_extra=env, want_rc=2)
    msg = f"step {INJECT}: gradient overflow with the loss scale already at its minimum (16)"
    check("scaler.min.exit_status_2", r.rc == 2, f"exit status {r.rc}; stderr {r.err.strip()[-300:]!r}")
    check("scaler.min.message", msg in r.err and "fp16.min_loss_scale" in r.err,
          f"stderr lacks {msg!r} and 'fp16.min_loss_scale': {r.err.strip()[-400:]!r}")
    steps = [row.get("step") for row in r.rows]
    check("scaler.min.stops_at_once", steps == list(range(1, INJECT)) and
          [row["loss_scale"] for row in r.rows] == [16] * (INJECT - 1),
          f"metrics steps {steps}, scales {[row['loss_scale'] for row in r.rows]}")


# ---- 3. activation checkpointing --------------------------------------------------------------
CKPT_STEPS = 3
CKPT_MICRO = 2
CKPT_VARIANTS = [("off", 0, False), ("i1", 1, False), ("i2", 2, False), ("i3", 3, False), ("i4", 4, False),
                 ("i2cpu", 2, True)]
CKPT_SETUPS = [(1, 0, "fp32"), (2, 3, "fp32"), (2, 3, "bf16")]


def ckpt_suite():
    L, C, NH = DEEP["n_layer"], DEEP["n_embd"], DEEP["n_head"]
    for N, stage, dt in CKPT_SETUPS:
        tag = f"n{N}s{stage}_{dt}"
        runs = {}
        for vname, interval, cpu in CKPT_VARIANTS:
            name = f"ckpt_{tag}_{vname}"
            ac = {"enabled": interval > 0, "interval": max(interval, 1), "cpu_checkpointing": cpu}
            cfg = make_config(name, model=DEEP, steps=CKPT_STEPS, stage=stage, micro=CKPT_MICRO, dtype=dt,
                              extra={"activation_checkpointing": ac})
            runs[vname] = run(name, N, cfg, CKPT_STEPS, dump=True)
        base = runs["off"]
        for vname, interval, cpu in CKPT_VARIANTS:
            r = runs[vname]
            if r is None:
                continue
            if vname != "off" and base is not None:
                g = {n: a for n, a in r.dump.items() if n.startswith("grad.")}
                gb = {n: a for n, a in base.dump.items() if n.startswith("grad.")}
                diff = params_equal(g, gb) if gb else "no grad.* tensors in the baseline dump"
                check(f"ckpt.{tag}.{vname}.grads_bitwise", not diff, diff)
                diff = params_equal({k: r.dump[k] for k in ("loss", "logits")},
                                    {k: base.dump[k] for k in ("loss", "logits")})
                check(f"ckpt.{tag}.{vname}.loss_logits_bitwise", not diff, diff)
                check(f"ckpt.{tag}.{vname}.losses_equal", r.losses() == base.losses(),
                      f"losses {r.losses()} vs {base.losses()}")
                diff = params_equal(r.final, base.final)
                check(f"ckpt.{tag}.{vname}.final_params_bitwise", not diff, diff)
            want_ck, want_act = expected_act_bytes(L, CKPT_MICRO, T, C, NH, interval)
            ck, act = r.memory["activation checkpoints"], r.memory["block activations"]
            check(f"ckpt.{tag}.{vname}.ckpt_bytes", ck["planned"] == want_ck and ck["peak"] == want_ck,
                  f"activation checkpoints planned {ck['planned']} peak {ck['peak']}, want {want_ck}")
            check(f"ckpt.{tag}.{vname}.activation_bytes", act["planned"] == want_act and act["peak"] == want_act,
                  f"block activations planned {act['planned']} peak {act['peak']}, want {want_act}")
            want_space = "pinned host" if cpu else "device"
            check(f"ckpt.{tag}.{vname}.ckpt_space", ck["space"] == want_space and act["space"] == "device",
                  f"activation checkpoints in {ck['space']!r}, block activations in {act['space']!r}; "
                  f"want {want_space!r}, 'device'")
            if vname != "off" and base is not None:
                total, total_off = ck["planned"] + act["planned"], base.planned("activation checkpoints") + \
                    base.planned("block activations")
                check(f"ckpt.{tag}.{vname}.saves_memory", total < total_off,
                      f"checkpoints + activations {total} B, without checkpointing {total_off} B")
        r, r2 = runs["i2cpu"], runs["i2"]
        if r is not None and r2 is not None:
            shrink = r2.space_total("device") - r.space_total("device")
            moved = r2.planned("activation checkpoints")
            check(f"ckpt.{tag}.cpu_moves_device_bytes", shrink == moved and r.space_total("pinned host") -
                  r2.space_total("pinned host") == moved,
                  f"device total shrinks by {shrink} B, pinned host grows by "
                  f"{r.space_total('pinned host') - r2.space_total('pinned host')} B, want {moved} B")
        if base is not None:
            sizes = {v: (runs[v].planned("activation checkpoints"), runs[v].planned("block activations"))
                     for v, _, _ in CKPT_VARIANTS if runs[v] is not None}
            note(f"ckpt {tag}: (checkpoint, block activation) bytes {sizes}")


# ---- 4. optimizer offload -----------------------------------------------------------------------
OFF_STEPS = 8
MOVED = ("fp32 master weights", "Adam m", "Adam v", "fp32 gradient shard")


def offload_suite():
    for dt in ("fp32", "bf16"):
        for stage in (1, 2, 3):
            tag = f"{dt}_s{stage}"
            pair = {}
            for dev in ("none", "cpu"):
                name = f"off_{tag}_{dev}"
                cfg = make_config(name, steps=OFF_STEPS, stage=stage, micro=2, accum=2, dtype=dt,
                                  extra={"zero_optimization": {"offload_optimizer": {"device": dev}}})
                pair[dev] = run(name, 2, cfg, OFF_STEPS)
            a, b = pair["cpu"], pair["none"]
            if a is None or b is None:
                continue
            diff = params_equal(a.final, b.final)
            check(f"offload.{tag}.final_params_bitwise", not diff, diff)
            check(f"offload.{tag}.losses_equal", a.losses() == b.losses() and a.col("grad_norm") == b.col("grad_norm"),
                  f"losses {a.losses()} vs {b.losses()}, norms {a.col('grad_norm')} vs {b.col('grad_norm')}")
            spaces = {c: (b.memory[c]["space"], a.memory[c]["space"]) for c in MOVED}
            check(f"offload.{tag}.spaces", all(s == ("device", "pinned host") for s in spaces.values()),
                  f"(without, with offload) spaces {spaces}")
            # every other class keeps its space and bytes, except (fp32, stages 2-3) the two pools of
            # full-unit gradients: with offload fp32 takes the master-copy path of zero.c, whose
            # gradient is cast into a send buffer and its unit gradient buffer freed at once
            # and its gradient shard, which becomes the one receive buffer of the reduce-scatters (the
            # shard itself moves to pinned host memory as the fp32 gradient shard)
            pools = ["unit gradient buffers", "gradient send buffers", "gradient shard"] \
                if dt == "fp32" and stage >= 2 else []
            changed = [c for c in b.memory if c not in MOVED and (a.memory[c]["space"], a.planned(c)) !=
                       (b.memory[c]["space"], b.planned(c))]
            check(f"offload.{tag}.other_classes_unchanged", [c for c in changed if c not in pools] == [],
                  f"classes whose space or bytes change: {changed}")
            peak_ok = all(v["planned"] == v["peak"] for r in (a, b) for v in r.memory.values())
            check(f"offload.{tag}.planned_equals_peak", peak_ok, "some class's peak differs from its plan")
            shrink = b.space_total("device") - a.space_total("device")
            if dt == "fp32":
                # no device master or fp32 gradient shard to move in fp32: Adam m and v leave the device
                grown = sum(a.planned(c) - b.planned(c) for c in pools)
                want = b.planned("Adam m") + b.planned("Adam v") - grown
                why = f"Adam m + Adam v - {grown} B more in the gradient pools"
                check(f"offload.{tag}.master_and_fp32_grads_pinned",
                      b.planned("fp32 master weights") == 0 and a.planned("fp32 master weights") == b.planned("Adam m")
                      and a.planned("fp32 gradient shard") == b.planned("gradient shard"),
                      f"master {b.planned('fp32 master weights')} -> {a.planned('fp32 master weights')} B, fp32 "
                      f"gradient shard {b.planned('fp32 gradient shard')} -> {a.planned('fp32 gradient shard')} B")
            else:
                want = sum(b.planned(c) for c in MOVED)
                same = all(a.planned(c) == b.planned(c) for c in MOVED)
                check(f"offload.{tag}.moved_bytes_unchanged", same,
                      f"{ {c: (b.planned(c), a.planned(c)) for c in MOVED} }")
                why = "master + Adam m + Adam v + fp32 gradient shard"
            check(f"offload.{tag}.device_total_shrinks", shrink == want and shrink > 0,
                  f"device total {b.space_total('device')} -> {a.space_total('device')} B: shrinks by {shrink}, "
                  f"want {want} ({why})")
            if stage == 3:
                note(f"offload {tag}: device total {b.space_total('device')} -> {a.space_total('device')} B, "
                     f"pinned host {b.space_total('pinned host')} -> {a.space_total('pinned host')} B")


# ---- 5. bad input ----------------------------------------------------------------------------------
def bad_suite():
    cases = [
        ("fp16_and_bf16", {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
         ["fp16.enabled", "bf16.enabled"]),
        ("loss_scale_window_0", {"fp16": {"enabled": True, "loss_scale_window": 0}}, ["fp16.loss_scale_window"]),
        ("ckpt_interval_0", {"activation_checkpointing": {"enabled": True, "interval": 0}},
         ["activation_checkpointing.interval"]),
        ("ckpt_interval_gt_layers", {"activation_checkpointing": {"enabled": True, "interval": SMALL["n_layer"] + 1}},
         ["activation_checkpointing.interval"]),
        ("offload_nvme", {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
         ["zero_optimization.offload_optimizer.device", "nvme_path' is not set"]),
    ]
    for name, extra, words in cases:
        cfg = make_config("bad_" + name, steps=2, extra=extra)
        rc, out, err = launch("bad_" + name, 1, cfg)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        check(f"bad.{name}.exit_status_2", rc == 2, f"exit status {rc}")
        check(f"bad.{name}.one_line_naming_key", len(lines) == 1 and lines[0].startswith("shardlm: error:") and
              all(w in lines[0] for w in words), f"stderr {lines}, want one error line with {words}")


# ---- 6. the DeepSpeed config ------------------------------------------------------------------------
DS_STEPS = 4


def ds_suite():
    ds = os.path.join(ROOT, "input", "ds_config.json")
    if not os.path.isfile(ds):
        check("ds.config_present", False, f"{ds} is missing")
        return
    model = {"model": dict(SMALL), "data": {"train": DATA, "seq_len": T, "shuffle": False},
             "train": {"steps": 100, "seed": 1234, "eval_every": 0, "sample_tokens": 0,
                       "metrics": os.path.join(TMP, "ds_plain.jsonl")}}
    mcfg = os.path.join(TMP, "ds_model.json")
    with open(mcfg, "w") as f:
        json.dump(model, f, indent=1)
    r = run("ds_plain", 2, mcfg, DS_STEPS, final=False, args=["--deepspeed", ds, "--set", f"train.steps={DS_STEPS}"])
    if r is not None:
        losses = r.losses()
        check("ds.trains", all(math.isfinite(x) for x in losses) and not any(r.col("skipped")),
              f"losses {losses}, skipped {r.col('skipped')}")
        # DeepSpeed's default stage3_param_persistence_threshold (1e5) keeps these tiny units whole:
        # 2 bytes per padded element; the optimizer range is the shard: 4 bytes per shard element
        numels = unit_numels(SMALL["n_layer"], SMALL["n_embd"], V, T)
        want_p = sum(arena_round(2 * round_up(n, 2 * ALIGN)) for n in numels)
        want_m = sum(arena_round(4 * s) for s in shard_elems(numels, 2))
        got_p, got_m = r.memory["parameter shard"]["planned"], r.memory["fp32 master weights"]["planned"]
        check("ds.fp16_stage3", "ZeRO stage 3 | fp16" in r.out and set(r.col("loss_scale")) == {65536} and
              got_p == want_p and got_m == want_m,
              f"scales {sorted(set(r.col('loss_scale')))}, parameter shard {got_p} B (want {want_p}), master "
              f"{got_m} B (want {want_m}), banner {[ln for ln in r.out.splitlines() if 'ZeRO' in ln][:1]}")
        spaces = {c: r.memory[c]["space"] for c in MOVED}
        check("ds.optimizer_state_pinned_host", all(s == "pinned host" for s in spaces.values()), f"{spaces}")
        note(f"ds_config.json: losses {losses}")
    # DeepSpeed's usual extra keys, with DeepSpeed's own spelling of the number (5e8)
    with open(ds) as f:
        text = f.read()
    doc = json.loads(text)
    doc["zero_optimization"]["reduce_bucket_size"] = "@RBS@"
    doc["zero_optimization"]["contiguous_gradients"] = True
    ds2 = os.path.join(TMP, "ds_config_extra.json")
    with open(ds2, "w") as f:
        f.write(json.dumps(doc, indent=1).replace('"@RBS@"', "5e8"))
    with open(mcfg, "w") as f:
        json.dump(merge(model, {"train": {"metrics": os.path.join(TMP, "ds_extra.jsonl")}}), f, indent=1)
    r = run("ds_extra", 2, mcfg, DS_STEPS, final=False, args=["--deepspeed", ds2, "--set", f"train.steps={DS_STEPS}"])
    if r is not None:
        warn = [ln for ln in r.err.splitlines() if "warning" in ln]
        for key in ("reduce_bucket_size", "contiguous_gradients"):
            hits = [ln for ln in warn if key in ln]
            check(f"ds.warns_once.{key}", len(hits) == 1, f"{len(hits)} warning lines name {key}: {warn}")
        check("ds.extra_trains", all(math.isfinite(x) for x in r.losses()), f"losses {r.losses()}")


def main():
    if not os.access(BIN, os.X_OK):
        check("binary", False, f"{BIN} is not an executable; run 'make all' or set SHARDLM_BIN")
        return
    t0 = time.time()
    for suite in (bad_suite, lambda: scaler_suite(precision_suite()), ckpt_suite, offload_suite, ds_suite):
        t = time.time()
        suite()
        note(f"{getattr(suite, '__name__', 'suite')}: {time.time() - t:.1f} s")
    note(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    harness.run_main("t_precision", main)
