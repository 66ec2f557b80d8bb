#!/usr/bin/env python3
"""t_llama_ref — shardlm's Llama against Hugging Face transformers'
LlamaForCausalLM, the model users trust, from the same weights and tokens.

shardlm trains a tiny Llama for 10 steps with --dump (weights, logits, loss
and every gradient of the first micro-batch) and --dump-final; the reference
loads the dumped weights into LlamaForCausalLM (transformers 4.40.2 in
build/ref-venv over Debian's torch 1.13; this script re-executes itself
there) in float64, so what is measured is shardlm's fp32 error. Error per
tensor: max|a - b| / max|b| (harness.rel).

Cases: grouped-query attention (4 heads, 2 KV heads) with rope_theta 5e5;
multi-head attention with tied embeddings and rms_norm_eps 1e-6; one KV head
with Llama 3.1's rope_scaling ("llama3"). transformers 4.40 predates
rope_scaling "llama3", so the reference's inv_freq is replaced by the
published Llama 3.1 formula computed here (the rest of the model is
transformers' own).

Checks per case: logits (the padded vocabulary columns exactly 0), loss and
every gradient (rel <= 1e-4; padded rows of embed_tokens / lm_head exactly
0), then 10 steps of torch AdamW: per-step losses (rel <= 1e-4) and the final
weights.
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "llama_ref.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, check, failures, read_dump, rel, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("t_llama_ref")
torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

V, T, B, STEPS = 100, 16, 4, 10
VP = 128
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1
CLIP = 1.8  # the gqa case's gradient norms straddle it (1.4 .. 2.1): both branches of clipping are compared
INIT_STD = 0.08
TOL = 1e-4
N_WINDOWS = 40

CASES = {
    "gqa": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_dim=48, rope_theta=500000.0),
    "tied": dict(n_layer=2, n_head=2, n_kv_head=2, n_embd=32, ffn_dim=64, tie_word_embeddings=True,
                 rms_norm_eps=1e-6),
    "llama3": dict(n_layer=1, n_head=4, n_kv_head=1, n_embd=32, ffn_dim=40,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}

rng = np.random.default_rng(7)
TOKENS = rng.integers(0, V, N_WINDOWS * T + 1)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)


def batch(first, nb):
    x = np.stack([TOKENS[(first + i) % N_WINDOWS * T:(first + i) % N_WINDOWS * T + T] for i in range(nb)])
    y = np.stack([TOKENS[(first + i) % N_WINDOWS * T + 1:(first + i) % N_WINDOWS * T + T + 1] for i in range(nb)])
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def run_shardlm(name, model):
    cfg = {
        "model": dict(type="llama", n_positions=64, vocab_size=V, init_std=INIT_STD, init_seed=11, **model),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": STEPS, "eval_every": 0, "sample_tokens": 0, "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_micro_batch_size_per_gpu": B,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
        "zero_optimization": {"stage": 0},
    }
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    dump, final = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    r = subprocess.run([BIN, "train", path, "--dump", dump, "--dump-final", final, "--quiet"],
                       env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    ok = r.returncode == 0
    check(f"{name}.run", ok, f"exit {r.returncode}: {r.stdout.decode(errors='replace')[-400:]}")
    if not ok:
        return None
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r_ for r_ in rows if "loss" in r_]
    return read_dump(dump), read_dump(final), rows


def llama3_inv_freq(inv_freq, rs):
    """Llama 3.1's published frequency scaling."""
    old, factor = rs["original_max_position_embeddings"], rs["factor"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    out = []
    for f in inv_freq.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            s = (old / wavelen - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float32)


def hf_model(model, weights):
    cfg = LlamaConfig(vocab_size=V, hidden_size=model["n_embd"], intermediate_size=model["ffn_dim"],
                      num_hidden_layers=model["n_layer"], num_attention_heads=model["n_head"],
                      num_key_value_heads=model["n_kv_head"], max_position_embeddings=64,
                      rms_norm_eps=model.get("rms_norm_eps", 1e-5), rope_theta=model.get("rope_theta", 10000.0),
                      tie_word_embeddings=model.get("tie_word_embeddings", False), attention_bias=False,
                      hidden_act="silu", attn_implementation="eager")
    hf = LlamaForCausalLM(cfg).to(torch.float64)
    if "rope_scaling" in model:
        for layer in hf.model.layers:
            rot = layer.self_attn.rotary_emb
            rot.inv_freq = llama3_inv_freq(rot.inv_freq.float(), model["rope_scaling"])
    state = {}
    for name in hf.state_dict():
        if name not in weights:
            continue
        w = weights[name]
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            w = w[:V]
        state[name] = torch.tensor(w, dtype=torch.float64)
    missing = [n for n, _ in hf.named_parameters() if n not in state]
    check("weights_cover_model", not missing, f"HF parameters without a dumped tensor: {missing[:4]}")
    hf.load_state_dict(state, strict=False)
    return hf


def loss_of(hf, x, y):
    logits = hf(input_ids=x).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def check_case(name, model):
    res = run_shardlm(name, model)
    if res is None:
        return
    dump, final, rows = res
    names = [n for n in dump if n.startswith("model.") or n == "lm_head.weight"]
    hf = hf_model(model, dump)
    x, y = batch(0, B)
    check(f"{name}.data", np.array_equal(dump["inputs"], x.numpy().astype(np.float32)), "dumped inputs differ")
    logits, loss = loss_of(hf, x, y)
    loss.backward()
    e = rel(dump["logits"][..., :V], logits.detach().numpy())
    check(f"{name}.logits", e <= TOL, f"rel err {e:.3e}")
    check(f"{name}.logits_padding_zero", not np.any(dump["logits"][..., V:]), "padded logit columns nonzero")
    e = rel(dump["loss"], np.array([loss.item()]))
    check(f"{name}.loss", e <= TOL, f"{float(dump['loss'].ravel()[0])} vs {loss.item()}: rel {e:.3e}")
    params = dict(hf.named_parameters())
    bad, worst = [], 0.0
    for n in names:
        if n not in params:
            continue
        g = dump["grad." + n]
        if n in ("model.embed_tokens.weight", "lm_head.weight"):
            if np.any(g[V:]):
                bad.append(f"{n} padded rows")
            g = g[:V]
        e = rel(g, params[n].grad.numpy())
        worst = max(worst, e)
        if not e <= TOL:
            bad.append(f"{n} {e:.3e}")
    check(f"{name}.grads", not bad and len(names) == len(params), f"{bad[:5]} ({len(names)} vs {len(params)} tensors)")
    print(f"# {name}: max gradient rel err {worst:.3e} over {len(names)} tensors", flush=True)

    hf = hf_model(model, dump)
    ps = dict(hf.named_parameters())
    decay = [p for n, p in ps.items() if p.dim() == 2]
    no_decay = [p for n, p in ps.items() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses, norms = [], []
    for s in range(STEPS):
        opt.zero_grad()
        xb, yb = batch(s * B, B)
        _, l_ = loss_of(hf, xb, yb)
        l_.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(ps.values()), CLIP)))
        opt.step()
        losses.append(l_.item())
    got = [r_["loss"] for r_ in rows]
    e = rel(np.array(got), np.array(losses)) if len(got) == STEPS else float("inf")
    check(f"{name}.train_losses", e <= TOL, f"rel {e:.3e}: {got[:3]} vs {losses[:3]}")
    got = [r_["grad_norm"] for r_ in rows]
    e = rel(np.array(got), np.array(norms)) if len(got) == STEPS else float("inf")
    check(f"{name}.train_grad_norms", e <= TOL and min(norms) < CLIP < max(norms) if name == "gqa" else e <= TOL,
          f"rel {e:.3e}; norms {min(norms):.3f}..{max(norms):.3f} (clip {CLIP})")
    bad = []
    for n, p in ps.items():
        w = final[n][:V] if n in ("model.embed_tokens.weight", "lm_head.weight") else final[n]
        e = rel(w, p.detach().numpy())
        if not e <= 10 * TOL:
            bad.append(f"{n} {e:.3e}")
    check(f"{name}.train_final_weights", not bad, f"{bad[:5]}")


for case, model in CASES.items():
    check_case(case, model)
sys.exit(1 if failures() else 0)
