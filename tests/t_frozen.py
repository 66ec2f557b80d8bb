#!/usr/bin/env python3
"""t_frozen — frozen units (DESIGN §11, issue 19 phase 1): a frozen unit is
sharded and gathered like any other but has no gradient, master or Adam
state, takes no part in the reductions, the gradient norm or the optimizer,
and its layers' weight gradients are never computed.

Units are frozen with the test hook SHARDLM_TEST_FREEZE (model.h,
model_freeze: "embedding", "head", "blocks" or unit indices), which both
`shardlm train` and `shardlm plan` read, until LoRA freezes the base units.

Cases (model, frozen units): GPT-2 2 layers with every block frozen;
Llama (untied, grouped-query) 3 layers with the embedding and block 0 frozen,
also with activation checkpointing every 2 blocks (the backward stops at
block 1: block 0 is gathered only to recompute block 1's input, the
embedding not at all); tied Llama with the embedding (so the LM head)
frozen; GPT-2 with the head (ln_f) frozen. Each at N = 1, 2 and stages
0-3, and some in bf16 with optimizer and parameter offload.

  bad.*                         the hook naming no unit, freezing every unit, or beside
                                checkpoint.dir: exit 2, one stderr line
  plan.prints_frozen            `shardlm plan` names the frozen parameters

Checks per run (one "ok NAME" / "FAIL NAME: why" line each):
  NAME.run                      the frozen run trains (exit 0, every step's metrics)
  NAME.frozen_bitwise_unchanged every frozen tensor after 6 steps equals its
                                initial value (the --dump of step 1) bit for bit
  NAME.trained_moved            every trained tensor with a nonzero gradient changed
  NAME.grads_equal_full_run     the trained tensors' step-1 gradients equal, bit for
                                bit, those of the same run with nothing frozen (the
                                input-gradient-only backward changes no trained
                                gradient); the dump has no gradient of a frozen tensor
  NAME.norm_over_trained        fp32: the step-1 gradient norm is the norm of the
                                trained gradients alone (rel 1e-6)
  NAME.same_as_N1_stage0        loss and gradient norm of every step and every final
                                parameter within 1e-5 of the N=1 stage-0 frozen run
  NAME.plan_eq_peak             every buffer class: `shardlm plan --target cpu` with the
                                same SHARDLM_TEST_FREEZE = the trainer's plan = its
                                measured peak, in the same space
  NAME.state_bytes              the parameter, gradient, master and Adam classes equal
                                the formulas below, where a frozen unit has parameter
                                bytes only
  NAME.traffic                  bytes sent per step = the formulas below (frozen units:
                                no all-reduce, reduce-scatter or after-step all-gather;
                                at stage 3 gathered for forward, and for backward only
                                where the backward needs them) = the plan's figures
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BIN, ENV, arena_round, check, note, read_dump, rel, round_up, run_main,  # noqa: E402
                     scratch_dir, write_shard)

TMP = scratch_dir("t_frozen")
V, T = 100, 16
VP = round_up(V, 128)
ALIGN = 16  # MODEL_TENSOR_ALIGN
STEPS = 6
BATCH, MICRO = 4, 2  # the same global batch at N = 1 (2 micro-batches accumulated) and N = 2
TOL = 1e-5
FREEZE = "SHARDLM_TEST_FREEZE"
DATA = os.path.join(TMP, "train.bin")

GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 32}
LLAMA = {"type": "llama", "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "ffn_dim": 40}
LLAMA_TIED = {"type": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "ffn_dim": 48,
              "tie_word_embeddings": True}


# ---- the model's units (model.c's layout) ------------------------------------------------------------
def units_of(model):
    """[(unit name, numel, [tensor names])] in unit order, as model.c lays them out."""
    L, C = model["n_layer"], model["n_embd"]

    def unit(name, tensors):  # tensors: (name, numel, packed)
        n, names = 0, []
        for tname, numel, packed in tensors:
            n = (n if packed else round_up(n, ALIGN)) + numel
            names.append(tname)
        return (name, round_up(n, ALIGN), names)

    if model.get("type") != "llama":
        units = [unit("embedding", [("wte.weight", VP * C, False), ("wpe.weight", T * C, False)])]
        for l in range(L):
            p = f"h.{l}."
            units.append(unit(f"block {l}", [
                (p + "ln_1.weight", C, False), (p + "ln_1.bias", C, False),
                (p + "attn.c_attn.weight", C * 3 * C, False), (p + "attn.c_attn.bias", 3 * C, False),
                (p + "attn.c_proj.weight", C * C, False), (p + "attn.c_proj.bias", C, False),
                (p + "ln_2.weight", C, False), (p + "ln_2.bias", C, False),
                (p + "mlp.c_fc.weight", C * 4 * C, False), (p + "mlp.c_fc.bias", 4 * C, False),
                (p + "mlp.c_proj.weight", 4 * C * C, False), (p + "mlp.c_proj.bias", C, False)]))
        units.append(unit("head", [("ln_f.weight", C, False), ("ln_f.bias", C, False)]))
        return units
    F, KV = model["ffn_dim"], C // model["n_head"] * model["n_kv_head"]
    units = [unit("embedding", [("model.embed_tokens.weight", VP * C, False)])]
    for l in range(L):
        p = f"model.layers.{l}."
        units.append(unit(f"block {l}", [
            (p + "input_layernorm.weight", C, False), (p + "self_attn.q_proj.weight", C * C, False),
            (p + "self_attn.k_proj.weight", KV * C, True), (p + "self_attn.v_proj.weight", KV * C, True),
            (p + "self_attn.o_proj.weight", C * C, False), (p + "post_attention_layernorm.weight", C, False),
            (p + "mlp.gate_proj.weight", F * C, False), (p + "mlp.up_proj.weight", F * C, True),
            (p + "mlp.down_proj.weight", C * F, False)]))
    head = [("model.norm.weight", C, False)]
    if not model.get("tie_word_embeddings"):
        head.append(("lm_head.weight", VP * C, False))
    units.append(unit("head", head))
    return units


def frozen_units(model, spec):
    L = model["n_layer"]
    out = set()
    for item in spec.split(","):
        if item == "embedding":
            out.add(0)
        elif item == "head":
            out.add(L + 1)
        elif item == "blocks":
            out.update(range(1, L + 1))
        else:
            out.add(int(item))
    return out


def backward_gathers(model, frozen, interval):
    """{unit: times the train pass gathers it} (family.c's walk): forward once each, the head's backward inside
    the forward (tied: the embedding again for the LM head, then the head unit again for the final norm's
    backward); backward the segments down to the lowest trained unit (a frozen embedding not at all), so a block
    below it is gathered there only to recompute a needed block's input inside its segment."""
    L, tied = model["n_layer"], model.get("type") != "llama" or model.get("tie_word_embeddings", False)
    gathers = {u: 1 for u in range(L + 2)}
    if tied:
        gathers[0] += 1  # the LM head
        gathers[L + 1] += 1  # the final norm's backward after it
    lowest = 0 if 0 not in frozen else next((l for l in range(L) if l + 1 not in frozen), L)
    k = interval or 1
    for s in range((L + k - 1) // k):
        l0, l1 = s * k, min(s * k + k, L)
        if l1 > lowest:
            for l in range(l0, l1):
                gathers[l + 1] += 1
    if 0 not in frozen and not tied:
        gathers[0] += 1  # gathered again for the token embedding's gradient
    return gathers


def expected(model, frozen, N, stage, esize, master, interval, accum, threshold, offload_param):
    """The state classes' bytes (zero.c's decide_role) and the bytes sent per step (ring formulas)."""
    b = {"parameter shard": 0, "gradient shard": 0, "fp32 gradient shard": 0, "fp32 master weights": 0,
         "Adam m": 0, "Adam v": 0}
    t = {"bytes_allgather": 0, "bytes_reduce_scatter": 0, "bytes_allreduce": 0}
    gathers = backward_gathers(model, frozen, interval)
    largest_shard = 0
    for u, (_, numel, _) in enumerate(units_of(model)):
        padded = round_up(numel, N * ALIGN)
        shard = padded // N
        sharded = stage == 3 and (offload_param or numel > threshold)
        b["parameter shard"] += arena_round(esize * (shard if sharded else padded))
        if sharded:
            t["bytes_allgather"] += gathers[u] * accum * (N - 1) * shard * esize
        if u in frozen:
            continue
        opt = padded if stage == 0 else shard
        grad_class = "fp32 gradient shard" if master else "gradient shard"
        if stage <= 1:
            b[grad_class] += arena_round(4 * padded)
            if master:
                b["gradient shard"] += arena_round(esize * padded)  # cast for the all-reduce
            t["bytes_allreduce"] += 2 * (N - 1) * padded * esize // N
        else:
            b[grad_class] += arena_round(4 * shard)
            largest_shard = max(largest_shard, shard)
            t["bytes_reduce_scatter"] += accum * (N - 1) * shard * esize
        if stage >= 1 and not sharded:
            t["bytes_allgather"] += (N - 1) * shard * esize
        if master:
            b["fp32 master weights"] += arena_round(4 * opt)
        b["Adam m"] += arena_round(4 * opt)
        b["Adam v"] += arena_round(4 * opt)
    if stage >= 2 and master and largest_shard:
        b["gradient shard"] += arena_round(esize * largest_shard)  # the one reduce-scatter receive buffer
    return b, t


# ---- runs ------------------------------------------------------------------------------------------
def config(name, model, stage, dtype="fp32", interval=0, offload=False, metrics=True):
    cfg = {
        "model": dict(model, vocab_size=V, n_positions=T),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": STEPS, "seed": 1234, "sample_tokens": 0},
        "train_batch_size": BATCH, "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "stage3_prefetch_bucket_size": 20000,
                              "stage3_param_persistence_threshold": 100,
                              "offload_optimizer": {"device": "cpu" if offload else "none"}},
    }
    if metrics:
        cfg["train"]["metrics"] = os.path.join(TMP, name + ".jsonl")
    if offload:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    if interval:
        cfg["activation_checkpointing"] = {"enabled": True, "interval": interval}
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def train(name, N, cfg, freeze, steps, final):
    env = dict(ENV)
    env.pop(FREEZE, None)
    if freeze:
        env[FREEZE] = freeze
    dump, fin = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg, "--quiet", "--dump", dump,
           "--set", f"train.steps={steps}"] + (["--dump-final", fin] if final else [])
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        check(f"{name}.run", False, f"exit {r.returncode}: {r.stdout.decode(errors='replace')[-600:]}")
        return None
    out = {"dump": read_dump(dump), "final": read_dump(fin) if final else None, "rows": [], "memory": None}
    mpath = os.path.join(TMP, name + ".jsonl")
    if os.path.exists(mpath):
        rows = [json.loads(line) for line in open(mpath) if line.strip()]
        out["rows"] = [row for row in rows if "loss" in row]
        out["memory"] = next((row["memory"] for row in rows if "memory" in row), None)
    return out


def plan_json(cfg, N, freeze):
    env = dict(ENV, **{FREEZE: freeze})
    r = subprocess.run([BIN, "plan", cfg, "--target", "cpu", "--ranks", str(N), "--json"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    lines = [line for line in r.stdout.decode().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if r.returncode == 0 and lines else None


def tensor_units(model):
    return {t: u for u, (_, _, names) in enumerate(units_of(model)) for t in names}


def comparable(name, value, model):
    """A tensor as runs of different world sizes and stages can agree on it: GPT-2's c_attn.bias without its key
    slice, whose exact gradient is 0 and whose value is fp32 rounding noise (t_zero.py, compare_params)."""
    if not name.endswith("attn.c_attn.bias"):
        return value
    C = model["n_embd"]
    return np.asarray(value)[np.r_[0:C, 2 * C:3 * C]]


def check_run(name, model, spec, N, stage, dtype, interval, offload, base):
    """Runs the frozen case and the same run with nothing frozen; checks; returns the frozen run."""
    frozen = frozen_units(model, spec)
    unit_of = tensor_units(model)
    cfg = config(name, model, stage, dtype, interval, offload)
    run = train(name, N, cfg, spec, STEPS, True)
    full = train(name + "_full", N, config(name + "_full", model, stage, dtype, interval, offload, False), None,
                 1, False)
    if run is None or full is None:
        return None
    steps = [row["step"] for row in run["rows"]]
    check(f"{name}.run", steps == list(range(1, STEPS + 1)), f"metrics steps {steps}")
    first, final, d = run["dump"], run["final"], full["dump"]
    frozen_names = [t for t, u in unit_of.items() if u in frozen]
    trained_names = [t for t, u in unit_of.items() if u not in frozen]
    changed = [t for t in frozen_names if not np.array_equal(first[t], final[t])]
    check(f"{name}.frozen_bitwise_unchanged", frozen_names and not changed, f"changed: {changed[:4]}")
    still = [t for t in trained_names if np.any(first["grad." + t]) and np.array_equal(first[t], final[t])]
    check(f"{name}.trained_moved", not still, f"unchanged after {STEPS} steps: {still[:4]}")
    differ = [t for t in trained_names if not np.array_equal(first["grad." + t], d["grad." + t])]
    dumped = [t for t in frozen_names if "grad." + t in first]
    check(f"{name}.grads_equal_full_run", not differ and not dumped,
          f"trained gradients that differ: {differ[:4]}; frozen gradients dumped: {dumped[:4]}")
    if dtype == "fp32":
        norm = float(np.sqrt(sum(float(np.sum(first["grad." + t].astype(np.float64) ** 2)) for t in trained_names)))
        got = run["rows"][0]["grad_norm"]
        check(f"{name}.norm_over_trained", abs(got - norm) <= 1e-6 * norm, f"logged {got}, trained grads {norm}")
    if base is not None and base is not run:
        bl, rl = base["rows"], run["rows"]
        el = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rl, bl))
        en = max(abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"]) for a, b in zip(rl, bl))
        ep = {t: rel(comparable(t, final[t], model), comparable(t, base["final"][t], model)) for t in unit_of}
        worst = max(ep, key=ep.get)
        check(f"{name}.same_as_N1_stage0", max(el, en, ep[worst]) <= TOL,
              f"loss {el:.2e}, grad norm {en:.2e}, params {ep[worst]:.2e} ({worst})")
    plan = plan_json(cfg, N, spec)
    mem = run["memory"]
    if plan is None or mem is None:
        check(f"{name}.plan_eq_peak", False, f"plan {plan is not None}, metrics memory {mem is not None}")
        return run
    bad = [f"{c}: plan {plan['memory'][c]}, trainer {v}" for c, v in mem.items()
           if not (plan["memory"][c]["bytes"] == v["planned"] == v["peak"] and plan["memory"][c]["space"] == v["space"])]
    check(f"{name}.plan_eq_peak", not bad and len(mem) == len(plan["memory"]), "; ".join(bad[:3]))
    esize = 4 if dtype == "fp32" else 2
    want_bytes, want_traffic = expected(model, frozen, N, stage, esize, dtype != "fp32" or offload, interval,
                                        BATCH // (MICRO * N), 100, offload)
    got_bytes = {c: mem[c]["planned"] if c in mem else 0 for c in want_bytes}
    check(f"{name}.state_bytes", got_bytes == want_bytes, f"trainer {got_bytes}, formula {want_bytes}")
    kinds = list(want_traffic)
    off = [(row["step"], {k: row[k] for k in kinds}) for row in run["rows"] if any(row[k] != want_traffic[k]
                                                                                   for k in kinds)]
    check(f"{name}.traffic", not off and all(plan[k] == want_traffic[k] for k in kinds),
          f"formula {want_traffic}, plan {({k: plan[k] for k in kinds})}, logged {off[:1]}")
    return run


def check_bad_hook():
    """The hook's bad input: one line, exit status 2."""
    cfg = config("bad", GPT2, 0)
    cases = (("bad.unknown_unit", "blocks,7", {}, "\"7\" names no unit"),
             ("bad.every_unit", "embedding,blocks,head", {}, "leaves nothing to train"),
             ("bad.checkpoints", "blocks", {"checkpoint.dir": os.path.join(TMP, "ckpt")},
              "checkpoints of a run with frozen units are not supported yet"))
    for name, spec, sets, needle in cases:
        extra = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        r = subprocess.run([BIN, "train", cfg, "--quiet"] + extra, env=dict(ENV, **{FREEZE: spec}),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        err = [line for line in r.stderr.decode().splitlines() if line.strip()]
        check(name, r.returncode == 2 and len(err) == 1 and needle in err[0], f"exit {r.returncode}, stderr {err}")
    r = subprocess.run([BIN, "plan", cfg, "--target", "cpu"], env=dict(ENV, **{FREEZE: "blocks"}),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    check("plan.prints_frozen", r.returncode == 0 and "frozen: 25408 parameters" in r.stdout.decode(),
          r.stdout.decode()[:300])


CASES = [
    ("gpt2_blocks", GPT2, "blocks", 0),
    ("llama_emb_b0", LLAMA, "embedding,1", 0),
    ("llama_emb_b0_ckpt2", LLAMA, "embedding,1", 2),
    ("llamatied_emb", LLAMA_TIED, "embedding", 0),
    ("gpt2_head", GPT2, "head", 0),
]


def main():
    write_shard(DATA, np.random.default_rng(11).integers(0, V, size=400 * T + 1))
    check_bad_hook()
    for case, model, spec, interval in CASES:
        base = None
        for N in (1, 2):
            for stage in range(4):
                if case == "gpt2_head" and stage in (1, 2):
                    continue
                name = f"{case}_N{N}_s{stage}"
                run = check_run(name, model, spec, N, stage, "fp32", interval, False, base)
                if N == 1 and stage == 0:
                    base = run
        if interval == 0 and case != "gpt2_head":
            check_run(f"{case}_N2_s3_bf16_offload", model, spec, 2, 3, "bf16", interval, True, None)
    note("frozen units: every case at N = 1, 2, stages 0-3")


if __name__ == "__main__":
    run_main("t_frozen", main)
