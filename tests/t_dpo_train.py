#!/usr/bin/env python3
"""t_dpo_train — DPO training (issue 37) against PyTorch over transformers' LlamaForCausalLM.

The test writes a preference file of 12 random pairs (prompt untrained, completion trained) and trains a tiny
random Llama on it. The reference is LlamaForCausalLM in float64 holding the dumped weights, with TRL's
formulas (summed log-probs over the trained tokens, cDPO's label smoothing, IPO's mean log-probs and
(z - 1/(2 beta))^2), the loss the mean over the step's pairs.

Checks:
  full.ln2 / lora.ln2       step 1 (policy = reference): loss ln 2 within 1e-6, margins and rewards 0
  full.ref_equals_fresh     the precomputed reference file's log-probs = PyTorch's of the initial model
  full.ref_n2_equals_n1     the reference pass on 2 ranks (stage 3, micro-batches left over) = on 1
  KIND.loss / KIND.grads    the first step's loss and every gradient against PyTorch, with a reference file
                            made to differ from the policy (so z != 0): sigmoid, cdpo (0.1), ipo at N = 1,
                            stage 3 at N = 2 (accumulation 2, activation checkpoints) and N = 3,
                            chunks (the LM head 7 rows at a time: logits computed again before the backward);
                            bf16 (tolerance 2e-2), fp16
  KIND.metrics              rewards/chosen ... logps/rejected in the metrics JSONL = TRL's means
  lora_z.loss / .grads      LoRA with B random from the start (lora.init false): the in-step reference (the
                            adapters off) differs from the policy; loss, adapter gradients, margin against
                            PEFT with disable_adapter() as the reference (the frozen LM head 7 rows at a
                            time: its input gradient at scale 1, each row scaled after)
  lora.in_step_vs_file      LoRA: the base with the adapters off each step (no file) gives the losses of the
                            same run with a precomputed reference, step by step (4 steps)
  packed.ln2 / grouped.ln2  data.packing, data.group_by_length (pairs by their longer sample): step 1 ln 2
  z.packed.*                packed row pairs (file order, so the test knows which pairs): loss, gradients and
                            metrics against PyTorch
  resume.bitwise            4 steps = 2 steps + resume to 4 (the reference file loaded, not recomputed)
  bad.*                     one line, exit 2: a preference file without a dpo section, an SFT file, token
                            shards or data.val with one, a resume whose reference file changed, a reference
                            file of another data.seq_len (version 2: by its seq_len; version 1: by its counts)
  ref_file.*                the reference file records seq_len and max_prompt_length; a version-1 file is read;
                            (issue 46) version 3 records the dtype it was computed in and a CRC-32C of its data
                            (checked from Python), and no refusal below changes a file (by checksum)
  bad.ref_*                 (issue 46) one line, exit 2: a value edited in the file (the checksum), an fp32 file
                            reused by a bf16 run; dpo.ref_log_probs_path naming a sample file or a directory,
                            without the hint to delete it (given only about a reference file)
  resume.other_world_batch_said  (issue 46) resumed at 2 ranks from 1 with the micro-batch and accumulation
                            fixed: one warning names the batch size before and after and how to keep it
  resume.moved_reference    (issue 46) the checkpoint's reference file moved (same SHA-256) and named by
                            dpo.ref_log_probs_path: the resume reads it there and trains on
  out.*                     (issue 46) one line, exit 2, no file changed (by checksum): dpo.ref_log_probs_path
                            naming checkpoint.dir's latest or a step file a save would write, the preference
                            data or the config; train.metrics naming the reference read (configured, or named
                            by the resumed checkpoint); a refused resume appends nothing to the metrics
Under BUILD=build-asan the stage-3 and bf16 cases are left out (said so).
"""
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "dpo_train.env")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from harness import (BIN, ENV, check, files_state, note, peft_set_adapters, read_dump, rel, run_main,  # noqa: E402
                     scratch_dir, write_config, write_preferences)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from datafiles import set_str, write_samples, write_shard  # noqa: E402

TMP = scratch_dir("t_dpo_train")
ASAN = "asan" in os.environ.get("BUILD", "")
torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

V, VP, T = 100, 128, 16
N_PAIRS = 12
BETA = 0.1
LLAMA = dict(type="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_dim=48)
TOL = 2e-4

rng = np.random.default_rng(37)
PAIRS = []  # (tokens, trained) of chosen, rejected
for _ in range(N_PAIRS):
    prompt = list(rng.integers(0, V, rng.integers(2, 6)))
    pair = []
    for _ in range(2):
        comp = list(rng.integers(0, V, rng.integers(2, 7)))
        pair.append((prompt + comp, [0] * len(prompt) + [1] * len(comp)))
    PAIRS.append(pair)


def write_pref(path, pairs, fmt="shardlm-preferences"):
    return write_preferences(path, pairs, V, fmt)  # max_prompt_length 8: above every prompt


DATA = write_pref(os.path.join(TMP, "pref.h5"), PAIRS)
SFT = os.path.join(TMP, "sft.h5")
write_samples(SFT, [1, 2, 3, 4], [0, 1, 1, 1], [0, 4], V)


def config(name, micro=2, accum=2, world=1, stage=0, steps=1, dpo=None, lora=None, dtype="fp32", data=DATA,
           extra=None, shuffle=False):
    cfg = {
        "model": dict(LLAMA, n_positions=T, vocab_size=V, init_std=0.08, init_seed=11),
        "data": {"train": data, "seq_len": T, "shuffle": shuffle},
        "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "seed": 5,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": micro * accum * world, "train_micro_batch_size_per_gpu": micro,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if dpo is not None:
        cfg["dpo"] = dict({"beta": BETA, "ref_log_probs_path": os.path.join(TMP, name + ".ref.h5")}, **dpo)
    if lora is not None:
        cfg["lora"] = dict({"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}, **lora)
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    cfg.update(extra or {})
    return write_config(os.path.join(TMP, name + ".json"), cfg)


def train(name, path, ranks=1, args=(), dump=True, expect=0, metrics=None, env=None):
    d, final = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    cmd = [BIN, "train", path, "--quiet", "--dump-final", final] + (["--dump", d] if dump else []) + list(args)
    if ranks > 1:
        cmd = ["mpirun", "-q", "-np", str(ranks)] + cmd
    r = subprocess.run(cmd, env=dict(ENV, **(env or {})), capture_output=True, text=True, timeout=600)
    if expect:  # the result as it is (-1: whatever the exit status)
        return r
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}")
    if r.returncode != 0:
        return None
    with open(os.path.join(TMP, (metrics or name) + ".jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return (read_dump(d) if dump else None), read_dump(final), [x for x in rows if "loss" in x]


# ---- PyTorch ------------------------------------------------------------------------------------
def hf_model(weights):
    cfg = LlamaConfig(vocab_size=V, hidden_size=LLAMA["n_embd"], intermediate_size=LLAMA["ffn_dim"],
                      num_hidden_layers=LLAMA["n_layer"], num_attention_heads=LLAMA["n_head"],
                      num_key_value_heads=LLAMA["n_kv_head"], max_position_embeddings=T, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
                      attn_implementation="eager")
    hf = LlamaForCausalLM(cfg).to(torch.float64)
    state = {n: torch.tensor(w[:V] if n in ("model.embed_tokens.weight", "lm_head.weight") else w)
             for n, w in weights.items() if not n.startswith("grad.") and n not in ("inputs", "targets", "logits",
                                                                                       "loss")}
    missing, _ = hf.load_state_dict(state, strict=False)
    check("torch.weights_cover_model", not missing, f"{missing[:3]}")
    return hf


def seq_logps(hf, pairs):
    """[(sum, count)] of chosen, rejected per pair: log p of each trained token given the tokens before."""
    out = []
    for pair in pairs:
        row = []
        for ids, trained in pair:
            logits = hf(input_ids=torch.tensor([ids])).logits[0]
            lp = torch.log_softmax(logits, -1)
            pos = [p for p in range(1, len(ids)) if trained[p]]
            row.append((sum(lp[p - 1, ids[p]] for p in pos), len(pos)))
        out.append(row)
    return out


def trl_loss(pol, ref, loss_type="sigmoid", eps=0.0):
    """TRL's DPOTrainer.dpo_loss over the pairs, mean; and its metrics."""
    losses, rc, rr, pc, pr = [], [], [], [], []
    for (c, r), (refc, refr) in zip(pol, ref):
        if loss_type == "ipo":
            c, r = (c[0] / c[1], 1), (r[0] / r[1], 1)
        z = (c[0] - r[0]) - (refc - refr)
        if loss_type == "ipo":
            losses.append((z - 1 / (2 * BETA)) ** 2)
        else:
            ls = torch.nn.functional.logsigmoid
            losses.append(-(1 - eps) * ls(BETA * z) - eps * ls(-BETA * z))
        rc.append(BETA * (c[0] - refc))
        rr.append(BETA * (r[0] - refr))
        pc.append(c[0])
        pr.append(r[0])
    mean = lambda xs: float(sum(float(x) for x in xs) / len(xs))  # noqa: E731
    metrics = {"rewards/chosen": mean(rc), "rewards/rejected": mean(rr),
               "rewards/accuracies": mean([float(a > b) for a, b in zip(rc, rr)]),
               "rewards/margins": mean([a - b for a, b in zip(rc, rr)]), "logps/chosen": mean(pc),
               "logps/rejected": mean(pr)}
    return sum(losses) / len(losses), metrics


def ref_values(path, pairs_idx, loss_type):
    with h5py.File(path, "r") as f:
        lp, n = f["logps"][:], f["n_targets"][:]
    div = (lambda i: n[i]) if loss_type == "ipo" else (lambda i: 1)
    return [(lp[2 * k] / div(2 * k), lp[2 * k + 1] / div(2 * k + 1)) for k in pairs_idx]


def against_torch(name, res, n_pairs, ref_path, loss_type="sigmoid", eps=0.0, tol=TOL, grad_scale=1.0):
    """grad_scale: what the dumped gradients carry (fp16: the loss scale, which the optimizer divides out)."""
    dump, _, rows = res
    hf = hf_model(dump)
    idx = range(n_pairs) if isinstance(n_pairs, int) else n_pairs  # the step's pairs: the first n, or these
    pol = seq_logps(hf, [PAIRS[k] for k in idx])
    loss, metrics = trl_loss(pol, ref_values(ref_path, idx, loss_type), loss_type, eps)
    loss.backward()
    e = abs(rows[0]["loss"] - loss.item()) / max(abs(loss.item()), 1e-3)
    check(f"{name}.loss", e <= tol, f"shardlm {rows[0]['loss']:.9g}, torch {loss.item():.9g}")
    worst, where = 0.0, ""
    for n, p in hf.named_parameters():
        g = dump.get("grad." + n)
        if g is None:
            worst, where = 1.0, n + " missing"
            break
        g = (g[:V] if g.shape[0] == VP else g) / grad_scale
        e = rel(g, p.grad.numpy())
        if e > worst:
            worst, where = e, n
    check(f"{name}.grads", worst <= tol, f"rel {worst:.3e} at {where}")
    # bf16: z is 0 up to rounding on either side, so the accuracy (a sign) is not compared
    bad = [k for k, v in metrics.items() if abs(rows[0].get(k, math.inf) - v) > tol * max(1.0, abs(v)) and
           (tol <= TOL or k != "rewards/accuracies")]
    check(f"{name}.metrics", not bad, f"{[(k, rows[0].get(k), metrics[k]) for k in bad][:2]}")


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli, reflected), as src/core/crc32c computes it: crc32c(b"123456789") = 0xE3069283."""
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def ref_data_crc(lp, n):
    """A reference file's data_crc32c (version 3): /logps as little-endian float64, then /n_targets as int64."""
    return crc32c(np.asarray(lp, "<f8").tobytes() + np.asarray(n, "<i8").tobytes())


def perturb(path, seed, dtype=None):
    """The reference values moved away from the policy's, so that z != 0 (the file's identity stays: its checksum
    follows, as if computed so); DTYPE: the file says it was computed in that dtype."""
    with h5py.File(path, "r+") as f:
        lp = f["logps"][:] + np.random.default_rng(seed).uniform(-3, 3, f["logps"].shape)
        f["logps"][:] = lp
        f.attrs["data_crc32c"] = np.int64(ref_data_crc(lp, f["n_targets"][:]))
        if dtype:
            if "dtype" in f.attrs:
                del f.attrs["dtype"]
            set_str(f, "dtype", dtype)


def ln2(name, rows):
    r = rows[0]
    check(f"{name}.ln2", abs(r["loss"] - math.log(2)) <= 1e-6 and abs(r["rewards/margins"]) <= 1e-6 and
          abs(r["rewards/chosen"]) <= 1e-6, f"loss {r['loss']:.9f}, margin {r['rewards/margins']:.3g}")


# ---- cases ----------------------------------------------------------------------------------------
def check_full():
    res = train("full", config("full", dpo={}))
    if not res:
        return
    ln2("full", res[2])
    ref = os.path.join(TMP, "full.ref.h5")
    fresh = seq_logps(hf_model(res[0]), PAIRS)
    with h5py.File(ref, "r") as f:
        lp, n = f["logps"][:], f["n_targets"][:]
    want = np.array([[float(s) for s, _ in p] for p in fresh]).reshape(-1)
    counts = np.array([[c for _, c in p] for p in fresh]).reshape(-1)
    check("full.ref_equals_fresh", rel(lp, want) <= 1e-5 and np.array_equal(n, counts),
          f"rel {rel(lp, want):.3e}, counts {n[:4]} vs {counts[:4]}")
    # chunks: the LM head 7 rows at a time, so that the policy's logits are computed again for all chunks but
    # the last between the losses and the backward (the 64 rows are one chunk otherwise)
    cases = [("sigmoid", {}, "sigmoid", 0.0, {}), ("cdpo", {"label_smoothing": 0.1}, "sigmoid", 0.1, {}),
             ("ipo", {"loss_type": "ipo"}, "ipo", 0.0, {}),
             ("chunks", {}, "sigmoid", 0.0, {"SHARDLM_LOGITS_ROWS": "7"})]
    for kind, dpo, lt, eps, env in cases:
        name = "z." + kind
        path = config(name, dpo=dpo)
        subprocess.run(["cp", ref, os.path.join(TMP, name + ".ref.h5")], check=True)
        perturb(os.path.join(TMP, name + ".ref.h5"), 1)
        r = train(name, path, env=env)
        if r:
            against_torch(name, r, 4, os.path.join(TMP, name + ".ref.h5"), lt, eps)
    if ASAN:
        note("BUILD=build-asan: the stage-3 (N = 2, 3) and bf16 cases are left out")
        return
    # the reference pass over the ranks: 3 micro-batches of 5, 5 and 2 pairs on 2 ranks (the second rank's
    # second forward is a stand-in whose values are dropped)
    name = "ref_n2"
    if train(name, config(name, micro=5, accum=1, world=2, stage=3, dpo={}), ranks=2, dump=False):
        with h5py.File(os.path.join(TMP, name + ".ref.h5"), "r") as f:
            lp2, n2 = f["logps"][:], f["n_targets"][:]
        check("full.ref_n2_equals_n1", rel(lp2, lp) <= 1e-6 and np.array_equal(n2, n), f"rel {rel(lp2, lp):.3e}")
    # stage 3 with accumulation and activation checkpoints at N = 2; N = 3
    ckpt = {"activation_checkpointing": {"enabled": True, "interval": 1}}
    for n, micro, accum, extra in ((2, 1, 2, ckpt), (3, 1, 1, None)):
        name = f"z.s3_n{n}"
        path = config(name, micro=micro, accum=accum, world=n, stage=3, dpo={}, extra=extra)
        subprocess.run(["cp", os.path.join(TMP, "z.sigmoid.ref.h5"), os.path.join(TMP, name + ".ref.h5")], check=True)
        r = train(name, path, ranks=n)
        if r:
            against_torch(name, r, micro * accum * n, os.path.join(TMP, name + ".ref.h5"))
    name = "z.bf16"
    path = config(name, dpo={}, dtype="bf16")
    r = train(name, path)  # computes its own (bf16) reference: z = 0 up to rounding
    if r:
        ln2_err = abs(r[2][0]["loss"] - math.log(2))
        check("z.bf16.ln2", ln2_err <= 1e-6, f"{ln2_err:.3e}")
        against_torch(name, r, 4, os.path.join(TMP, name + ".ref.h5"), tol=2e-2)
    # fp16: the loss scale multiplies the pair weights as it does SFT's dloss (the optimizer divides it out)
    name = "z.fp16"
    path = config(name, dpo={}, dtype="fp16", steps=3)
    subprocess.run(["cp", os.path.join(TMP, "z.sigmoid.ref.h5"), os.path.join(TMP, name + ".ref.h5")], check=True)
    perturb(os.path.join(TMP, name + ".ref.h5"), 3, dtype="fp16")  # an fp32 file is refused by an fp16 run
    r = train(name, path)
    if r:
        check("z.fp16.scaled", r[2][0]["loss_scale"] > 1 and not any(x["skipped"] for x in r[2]) and len(r[2]) == 3,
              f"{[(x['loss_scale'], x['skipped']) for x in r[2]]}")
        against_torch(name, r, 4, os.path.join(TMP, name + ".ref.h5"), tol=2e-2, grad_scale=r[2][0]["loss_scale"])


def check_lora():
    lora = {"dropout": 0.0}
    a = train("lora", config("lora", steps=4, dpo={}, lora=lora, shuffle=True), dump=False)
    b = train("lora_file", config("lora_file", steps=4, dpo={"precompute_ref_log_probs": True}, lora=lora,
                                  shuffle=True), dump=False)
    if not a or not b:
        return
    ln2("lora", a[2])
    la, lb = [x["loss"] for x in a[2]], [x["loss"] for x in b[2]]
    check("lora.in_step_vs_file", len(la) == 4 and max(abs(x - y) for x, y in zip(la, lb)) <= 1e-5 and
          abs(la[-1] - math.log(2)) > 1e-4, f"{la} vs {lb}")


def check_lora_grads():
    """LoRA with B random from the start (lora.init false), so that the base with the adapters off (the
    in-step reference) differs from the policy: loss and adapter gradients against PEFT's disable_adapter()."""
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "v_proj", "down_proj"]
    # the frozen LM head in chunks of 7 rows: its input gradient at scale 1, the rows scaled after
    res = train("lora_z", config("lora_z", dpo={}, lora={"dropout": 0.0, "init": False, "target_modules": targets}),
                env={"SHARDLM_LOGITS_ROWS": "7"})
    if not res:
        return
    dump, _, rows = res
    base = {n: w for n, w in dump.items() if ".lora_" not in n}
    pm = get_peft_model(hf_model(base), LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=targets,
                                                   init_lora_weights=False))
    params, ours = dict(pm.named_parameters()), peft_set_adapters(pm, dump)
    check("lora_z.adapters_cover_peft", set(ours) == {n for n, p in pm.named_parameters() if p.requires_grad},
          f"{len(ours)} adapters")
    with torch.no_grad(), pm.disable_adapter():
        ref = [(float(c[0]), float(r[0])) for c, r in seq_logps(pm, PAIRS[:4])]
    loss, metrics = trl_loss(seq_logps(pm, PAIRS[:4]), ref)
    loss.backward()
    e = abs(rows[0]["loss"] - loss.item()) / abs(loss.item())
    check("lora_z.loss", e <= TOL and abs(loss.item() - math.log(2)) > 1e-3,
          f"shardlm {rows[0]['loss']:.9g}, torch {loss.item():.9g}")
    worst = max(rel(dump["grad." + ours[n]], params[n].grad.numpy()) for n in ours)
    check("lora_z.grads", worst <= TOL, f"rel {worst:.3e}")
    m = rows[0]["rewards/margins"]
    check("lora_z.metrics", abs(m - metrics["rewards/margins"]) <= TOL * max(1.0, abs(m)), f"{m} vs {metrics}")


def packed_rows(n_units):
    """The pairs of the first n_units row pairs: samples.c's first fit over the file order (every row open)."""
    fill, rows = [], []
    for k, pair in enumerate(PAIRS):
        lens = [len(ids) for ids, _ in pair]
        r = next((i for i, f in enumerate(fill) if all(f[j] + lens[j] <= T for j in range(2))), len(fill))
        if r == len(fill):
            fill.append([0, 0])
            rows.append([])
        fill[r] = [fill[r][j] + lens[j] for j in range(2)]
        rows[r].append(k)
    return [k for row in rows[:n_units] for k in row]


def check_packed():
    extra = {"data": {"train": DATA, "seq_len": T, "shuffle": True, "packing": True}}
    r = train("packed", config("packed", micro=2, accum=1, steps=2, dpo={}, extra=extra), dump=False)
    if r:
        ln2("packed", r[2])
    extra = {"data": {"train": DATA, "seq_len": T, "shuffle": True, "group_by_length": True}}
    r = train("grouped", config("grouped", micro=2, accum=1, steps=2, dpo={}, extra=extra), dump=False)
    if r:
        ln2("grouped", r[2])
    # 2 row pairs of whole pairs in file order, the reference moved off the policy: against PyTorch
    name = "z.packed"
    extra = {"data": {"train": DATA, "seq_len": T, "shuffle": False, "packing": True}}
    path = config(name, micro=2, accum=1, dpo={}, extra=extra)
    subprocess.run(["cp", os.path.join(TMP, "z.sigmoid.ref.h5"), os.path.join(TMP, name + ".ref.h5")], check=True)
    r = train(name, path)
    pairs = packed_rows(2)
    if r:
        check("z.packed.pairs", r[2][0]["pairs"] == len(pairs) > 2, f"{r[2][0]['pairs']} pairs, want {pairs}")
        against_torch(name, r, pairs, os.path.join(TMP, name + ".ref.h5"))


def check_resume():
    ck = os.path.join(TMP, "ck")
    extra = {"checkpoint": {"dir": ck, "every": 2}}
    full = train("resume_full", config("resume_full", steps=4, dpo={}, shuffle=True), dump=False)
    part = train("resume_a", config("resume_a", steps=2, dpo={}, shuffle=True, extra=extra), dump=False)
    ref = os.path.join(TMP, "resume_a.ref.h5")
    if not full or not part:
        return
    stamp = os.stat(ref).st_mtime_ns
    cfg = config("resume_a", steps=4, dpo={}, shuffle=True, extra=extra)
    res = train("resume_b", cfg, args=["--resume", "auto"], dump=False, metrics="resume_a")
    if res:
        same = all(np.array_equal(res[1][k], v) for k, v in full[1].items())
        check("resume.bitwise", same and os.stat(ref).st_mtime_ns == stamp,
              "final weights differ from the run without a stop, or the reference was recomputed")
    check_outputs(ck, cfg)
    metrics = os.path.join(TMP, "resume_a.jsonl")
    before = files_state(metrics)
    moved = os.path.join(TMP, "moved", "resume_a.ref.h5")
    os.makedirs(os.path.dirname(moved), exist_ok=True)
    subprocess.run(["cp", ref, moved], check=True)
    perturb(ref, 2)  # another file at the recorded path; on 2 ranks, still one line
    r = train("resume_bad", cfg, ranks=2, args=["--resume", "auto"], dump=False, expect=2)
    one_line("bad.resume_other_reference", r, "not the file the checkpoint was trained with")
    check("bad.resume_other_reference.metrics_untouched", files_state(metrics) == before,
          "the refused resume wrote to its metrics file")
    # the file the checkpoint recorded, moved (same SHA-256) and named by dpo.ref_log_probs_path: accepted
    moved_cfg = edited_config("resume_moved", config("resume_a", steps=6, dpo={}, shuffle=True, extra=extra),
                              dpo={"ref_log_probs_path": moved})
    res = train("resume_moved", moved_cfg, args=["--resume", "auto"], dump=False, metrics="resume_a", expect=-1)
    steps = [x.get("step") for x in map(json.loads, filter(str.strip, open(metrics))) if "loss" in x]
    check("resume.moved_reference", res.returncode == 0 and f"read from {moved}" in res.stderr + res.stdout
          and steps[-2:] == [5, 6], f"exit {res.returncode}, steps {steps}: {res.stderr[-400:]}")


def check_resume_world():
    """Issue 46: a DPO run resumed at 2 ranks from a checkpoint of 1, its config fixing the micro-batch and the
    accumulation (no train_batch_size), takes twice the pairs a step: said in one warning naming both batch sizes
    and how to keep the old one; the run goes on (exit 0)."""
    ck = os.path.join(TMP, "ck_world")
    shutil.rmtree(ck, ignore_errors=True)
    with open(config("world", steps=2, dpo={}, extra={"checkpoint": {"dir": ck, "every": 1}})) as f:
        cfg = json.load(f)
    del cfg["train_batch_size"]  # micro-batch 2 x accumulation 2 x the ranks
    cfg["gradient_accumulation_steps"] = 2
    path = write_config(os.path.join(TMP, "world.json"), cfg)
    first = train("world_a", path, dump=False, metrics="world")
    cfg["train"]["steps"] = 3
    path = write_config(os.path.join(TMP, "world.json"), cfg)
    r = train("world_b", path, ranks=2, args=["--resume", "auto"], dump=False, expect=-1)
    warn = [x for x in r.stderr.splitlines() if "train_batch_size" in x]
    check("resume.other_world_batch_said", first is not None and r.returncode == 0 and len(warn) == 1
          and "train_batch_size 4 (1 rank)" in warn[0] and "this run's is 8" in warn[0]
          and "give train_batch_size 4" in warn[0], f"exit {r.returncode}: {warn or r.stderr[-400:]}")


def edited_config(name, path, **sections):
    """A copy of the config at PATH, as TMP/NAME.json, with keys of its sections replaced (SECTION={KEY: VALUE})."""
    with open(path) as f:
        cfg = json.load(f)
    for section, keys in sections.items():
        cfg[section].update(keys)
    return write_config(os.path.join(TMP, name + ".json"), cfg)


def check_outputs(ck, resume_cfg):
    """Issue 46: a run's outputs against its inputs, before anything is opened for writing. CK holds resume_a's
    checkpoints (steps 2 and 4), which name resume_a.ref.h5 as their reference; no case changes a file."""
    ref = os.path.join(TMP, "resume_a.ref.h5")
    cases = []  # (name, config, args, text of the one error line)
    for name in ("latest", "step_000006.h5"):  # an existing file, and one a later save would write
        target = os.path.join(ck, name)
        cases.append((f"ref_in_checkpoint_dir.{name[:6]}",
                      config(f"out_ref_{name[:6]}", steps=6, dpo={"ref_log_probs_path": target},
                             extra={"checkpoint": {"dir": ck, "every": 2}}),
                      ["--resume", "none", "--overwrite"],  # a fresh start over CK, as asked for
                      f"dpo.ref_log_probs_path '{target}' is a file of checkpoint.dir"))
    # train.metrics naming the reference the run reads: the configured one, and the one a resumed checkpoint
    # names (known only once the resume has read it)
    cases.append(("metrics_is_reference",
                  edited_config("out_metrics_ref", config("out_metrics_ref", dpo={"ref_log_probs_path": ref}),
                                train={"metrics": ref}),
                  [], f"train.metrics '{ref}' is the DPO reference log-probs file"))
    cases.append(("metrics_is_resumed_reference",
                  edited_config("out_metrics_resumed", resume_cfg, train={"metrics": ref},
                                dpo={"ref_log_probs_path": os.path.join(TMP, "another.ref.h5")}),
                  ["--resume", "auto"], f"train.metrics '{ref}' is the DPO reference log-probs file"))
    # the reference the run would compute naming one of its inputs: the preference data, the config
    cases.append(("reference_is_data", config("out_ref_data", dpo={"ref_log_probs_path": DATA}), [],
                  f"dpo.ref_log_probs_path '{DATA}' is the train data file"))
    own = os.path.join(TMP, "out_ref_config.json")
    cases.append(("reference_is_config", config("out_ref_config", dpo={"ref_log_probs_path": own}), [],
                  f"dpo.ref_log_probs_path '{own}' is the config file"))
    before = files_state(TMP)
    for name, path, args, text in cases:  # one after another: the cases on CK would meet its lock
        one_line(f"out.{name}", train(f"out_{name}", path, args=args, dump=False, expect=2), text)
    after = files_state(TMP)
    # (CK's lock file records the run that last held the directory: the refused runs on CK held it first)
    changed = sorted(p for p in before if after.get(p) != before[p] and not p.endswith("/.shardlm.lock"))
    check("out.nothing_changed", not changed, f"changed: {changed}")


def check_ref_seq_len():
    """The reference file (version 2) records data.seq_len and the preference file's max_prompt_length; a run at
    another seq_len refuses it in one line naming both; a version-1 file (no seq_len) is still read, and one
    computed at another length is caught by its samples' trained-token counts."""
    full = os.path.join(TMP, "full.ref.h5")
    with h5py.File(full, "r") as f:
        attrs = {k: int(f.attrs[k]) for k in ("version", "seq_len", "max_prompt_length") if k in f.attrs}
    check("ref_file.records_seq_len", attrs == {"version": 3, "seq_len": T, "max_prompt_length": 8}, str(attrs))

    def copy(name, v1):
        path = os.path.join(TMP, name + ".ref.h5")
        subprocess.run(["cp", full, path], check=True)
        if v1:
            with h5py.File(path, "r+") as f:
                f.attrs["version"] = np.int64(1)
                del f.attrs["seq_len"]
        return path
    short = {"data": {"train": DATA, "seq_len": 8, "shuffle": False, "truncation": "truncate"}}
    copy("seq8", False)
    copy("seq8_v1", True)
    copy("v1", True)
    v2, v1, ok = side_by_side([("seq8", config("seq8", dpo={}, extra=short)),
                               ("seq8_v1", config("seq8_v1", dpo={}, extra=short)), ("v1", config("v1", dpo={}))])
    one_line("bad.ref_other_seq_len", v2, f"computed at data.seq_len {T}, this run's is 8")
    one_line("bad.ref_v1_other_length", v1, "computed at another data.seq_len")
    check("ref_file.v1_still_read", ok.returncode == 0, f"exit {ok.returncode}: {ok.stderr[-400:]}")
    if ok.returncode == 0:
        with open(os.path.join(TMP, "v1.jsonl")) as f:
            ln2("ref_file.v1", [x for x in map(json.loads, filter(str.strip, f)) if "loss" in x])


def check_ref_integrity():
    """Issue 46: the reference file (version 3) records the dtype it was computed in and a CRC-32C of its data
    (the documented bytes: checked here from Python); a value edited in the file, and an fp32 file used by a
    bf16 run, are refused in one line; dpo.ref_log_probs_path naming a file that is not a reference file (a
    sample file, a directory) is refused without the hint to delete it. No case changes a file."""
    full = os.path.join(TMP, "full.ref.h5")
    with h5py.File(full, "r") as f:
        dtype = f.attrs.get("dtype")
        dtype = dtype.decode() if isinstance(dtype, bytes) else dtype
        crc_ok = "data_crc32c" in f.attrs and int(f.attrs["data_crc32c"]) == ref_data_crc(f["logps"][:],
                                                                                          f["n_targets"][:])
    check("ref_file.records_dtype_and_crc", dtype == "fp32" and crc_ok, f"dtype {dtype}, crc matches {crc_ok}")
    edited = os.path.join(TMP, "edited.ref.h5")
    subprocess.run(["cp", full, edited], check=True)
    with h5py.File(edited, "r+") as f:
        f["logps"][3] = f["logps"][3] - 0.5  # still a valid log-prob: only the checksum tells
    subprocess.run(["cp", full, os.path.join(TMP, "bf16ref.ref.h5")], check=True)
    refdir = os.path.join(TMP, "refdir")
    os.makedirs(refdir, exist_ok=True)
    jobs = [("edited", config("edited", dpo={})), ("bf16ref", config("bf16ref", dpo={}, dtype="bf16")),
            ("notref_sft", config("notref_sft", dpo={"ref_log_probs_path": SFT})),
            ("notref_dir", config("notref_dir", dpo={"ref_log_probs_path": refdir}))]
    before = files_state(TMP)
    edit, bf16, sft, dirr = side_by_side(jobs)
    one_line("bad.ref_edited_value", edit, "does not match its checksum")
    one_line("bad.ref_other_dtype", bf16, "was computed in fp32, this run trains in bf16")
    for name, r, text in (("sample_file", sft, "not a reference log-prob file"), ("directory", dirr, "directory")):
        one_line(f"bad.ref_is_{name}", r, text)
        check(f"bad.ref_is_{name}.no_delete_hint", "delete it" not in r.stderr and "name a reference log-prob file"
              in r.stderr, r.stderr[-300:])
    after = files_state(TMP)
    changed = sorted(p for p in set(before) | set(after) if after.get(p) != before.get(p))
    check("ref_file.refusals_change_nothing", not changed, f"changed: {changed}")


def one_line(name, r, text):
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    check(name, r.returncode == 2 and len(lines) == 1 and text in lines[0], f"exit {r.returncode}: {r.stderr[-400:]}")


def side_by_side(jobs):
    """train(name, path, dump=False, expect=2) for each (name, path), run at once (each process mostly waits on
    MPI's start); their results in order."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda job: train(job[0], job[1], dump=False, expect=2), jobs))


def check_bad():
    shards = os.path.join(TMP, "tokens.bin")
    write_shard(shards, np.arange(200) % V)
    extra = {"data": {"train": DATA, "val": DATA, "seq_len": T}}
    cases = [("bad_nodpo", config("bad_nodpo"), "bad.preference_without_dpo", "add a dpo section"),
             ("bad_sft", config("bad_sft", dpo={}, data=SFT), "bad.sft_with_dpo",
              "an SFT sample file, but the config has a dpo section"),
             ("bad_shards", config("bad_shards", dpo={}, data=shards), "bad.shards_with_dpo",
              "a dpo section needs a preference file"),
             ("bad_val", config("bad_val", dpo={}, extra=extra), "bad.val_with_dpo", "data.val with a dpo section")]
    for (_, _, check_name, text), r in zip(cases, side_by_side([c[:2] for c in cases])):
        one_line(check_name, r, text)


def main():
    check_full()
    check_lora()
    check_lora_grads()
    check_packed()
    check_resume()
    check_resume_world()
    check_bad()
    check_ref_seq_len()
    check_ref_integrity()


if __name__ == "__main__":
    run_main("dpo_train", main)
