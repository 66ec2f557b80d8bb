#!/usr/bin/env python3
"""t_qwen — Qwen2/Qwen2.5, Qwen3 and Phi-3 against transformers 5 (issue 48).

transformers 5.25 (build/ref5-venv over PyPI's torch 2.11 on the CPU; this
script re-executes itself there) makes tiny models with its own
save_pretrained, so that config.json is exactly as transformers writes it:
  qwen2   Qwen2ForCausalLM, q|k|v biases (set to random values: a model that
          dropped them could not pass), rope_theta 1e6, grouped-query
          attention (4 heads, 2 key/value heads), tied embeddings, fp32
  qwen3   Qwen3ForCausalLM, head_dim 32 with hidden_size 64 and 4 heads (the
          attention 128 wide, not 64), q_norm and k_norm with random weights,
          rms_norm_eps 1e-5, untied, fp32
  phi3    Phi3ForCausalLM: q|k|v fused in qkv_proj and gate|up in gate_up_proj
          in the files (shardlm keeps the parts: split at import, joined at
          export), rope_theta 250000, rms_norm_eps 1e-5 (Phi3Config's),
          grouped-query attention, untied, fp32
  qwen2_bf16  the qwen2 case saved in bf16 (the loss only)

Checks per case, against the transformers model in float64:
  X.N1.*      ZeRO 3 at N = 1, three AdamW steps (weight decay 0.1, clipping
              at 1.0) with --dump/--dump-final: the first micro-batch's
              logits and loss (rel 1e-5), every parameter's gradient (rel
              1e-4), the three steps' losses and the final weights against
              torch's AdamW with decay on the matrices only
  X.N2, X.N3  the step-1 loss at N = 2 and 3 (ZeRO 3) equals transformers'
              on the same windows (rel 1e-5)
  X.generate  32 tokens of greedy generation from token-id prompts equal
              transformers' generate(do_sample=False)
  X.export    checkpoint.export_hf of the N = 2 run loads in transformers 5
              as the same architecture, at shardlm's loss of the exported
              model (rel 1e-5)
  X.lora      LoRA r 4 on every linear layer (lora.init false: B not zero),
              one step at lr 0: the exported adapters load with PEFT 0.21
              onto the transformers base at shardlm's logits (rel 1e-4)
  X.lora      not for phi3, whose modules are the fused ones:
  phi3.lora_fused.*  LoRA on PEFT's Phi3 targets (qkv_proj, o_proj, gate_up_proj,
              down_proj: one A (r, C), one B (Q + 2 KV, r) over q|k|v), against
              PEFT 0.21: at N = 1 the loss and every adapter's gradient (rel
              1e-5) and three AdamW steps' losses; at N = 2 (lr 0) the loss and
              gradients, the export loaded by PEFT at shardlm's logits,
              export --merge loaded by transformers at PEFT's loss; a part
              (q_proj) as a target refused in one line naming the fused ones,
              a part (gate_proj) in modules_to_save refused in one line
  longrope.*  Phi-3's longrope (the 128k models' scaling) with random short
              and long factors, original_max_position_embeddings 16 and
              max_position_embeddings 128 (cos and sin scaled by
              sqrt(1 + ln 8 / ln 16)): at T = 32 (long factors) logits, loss,
              every gradient, N = 2 and 3 losses, and the short factors giving
              another loss (the check can fail); at T = 16 the logits; eval at
              both; the export loaded back by transformers at the same loss;
              greedy generation across 16 (rows crossing at different steps,
              4 rows a forward at N = 1 and 2, and 1) equal to transformers'
  X.dpo_lora.N1  one LoRA-DPO step (every linear layer; phi3: the fused ones; the
              reference the base with the adapters off) against PEFT 0.21 on
              transformers 5.25 and TRL's sigmoid loss (beta 0.1, sums of the
              completions' log-probs): loss and rewards/margins (rel 1e-5),
              every adapter's gradient (1e-4), the AdamW step's adapters;
              phi3.dpo_lora.N2 the same over two ranks
  refuse.*    MixtralForCausalLM (mixture-of-experts named), a rope_type
              shardlm lacks: one line
Sliding windows (issue 48 item 4), windows of 8 under sequences of T = 32:
  mistral     MistralForCausalLM, sliding_window 8 on every layer
  qwen2w      Qwen2ForCausalLM with use_sliding_window true and
              max_window_layers 1 of 3 layers: layer 0 full, 1 and 2 through
              the window (layer_types as save_pretrained writes them)
  each: N1 (logits, loss, every gradient, three AdamW steps), N2 and N3
  losses, the export (the window kept), 32 tokens of greedy generation past
  the window (the cache a ring of 8 on the sliding layers) at N = 1, 2 and
  3, eval's loss at N = 1 and 2;
  qwen2w.max_window_layers_1/_0: the same file without layer_types (the
  sliding layers from max_window_layers on: 1 and 2, or all) at
  transformers' loss of that file; refuse.*: max_window_layers -1 and
  sliding_window 0 in one line.
  mistral.packed: samples of 8 to 50 tokens packed into rows of 64 give the
  loss and every gradient of the same samples one per micro-batch (rel 1e-5):
  the window counts positions within each sample.
  partial.*   Phi-4-mini's partial rotary (partial_rotary_factor 0.75, 12 of
              16 channels turned) with longrope past 16: logits, loss, every
              gradient at T = 32, the whole rotation giving another loss, N = 2,
              the export (key kept) at transformers' loss, greedy generation;
              an odd rotated width and the key on Qwen2 refused in one line
`t_qwen.py window` runs the window cases only, `t_qwen.py longrope` the longrope and partial ones.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("qwen.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import (MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,  # noqa: E402
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from harness import (
    BIN, ENV, ROOT, byte_bpe_tokenizer, check, check_greedy, failures, note, read_dump, rel, scratch_dir,
    write_config, write_shard)  # noqa: E402

TMP = scratch_dir("t_qwen")
torch.set_num_threads(1)
V, T, B, STEPS = 320, 32, 2, 3
# eps 1e-4, not the default 1e-8: Adam's first steps move a weight by about lr whatever its gradient's size, so
# a gradient near zero whose sign fp32 and float64 disagree on would move it lr the other way; with eps above the
# gradients' fp32 error such a weight moves by g / eps, continuously
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-4, 0.1, 1.0
TOL, GRAD_TOL = 1e-5, 1e-4
TOKENS = np.random.default_rng(17).integers(0, V, 40 * T + 1)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)
SHAPE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)
CLASSES = {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM, "phi3": Phi3ForCausalLM,
           "mistral": MistralForCausalLM, "qwen2w": Qwen2ForCausalLM}
WINDOW = 8  # the sliding window of the window cases: a quarter of T


def qwen2(shape, **window):
    """A tied Qwen2 of shape with rope_theta 1e6 and random q|k|v biases (a model that dropped them could not
    pass); window: use_sliding_window and its keys."""
    q2 = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True, **window,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    with torch.no_grad():
        for layer in q2.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.normal_(0.0, 0.5)
    return q2


def make_models():
    dirs = {}
    torch.manual_seed(0)
    q2 = qwen2(SHAPE)
    dirs["qwen2"] = os.path.join(TMP, "qwen2")
    q2.save_pretrained(dirs["qwen2"])
    dirs["qwen2_bf16"] = os.path.join(TMP, "qwen2_bf16")
    q2.to(torch.bfloat16).save_pretrained(dirs["qwen2_bf16"])
    q3 = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    with torch.no_grad():
        for layer in q3.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.3)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.3)
    dirs["qwen3"] = os.path.join(TMP, "qwen3")
    q3.save_pretrained(dirs["qwen3"])
    # pad_token_id None: transformers' Llama-like models build nn.Embedding(padding_idx=pad_token_id), whose row
    # never receives a gradient; shardlm trains every row (README, "Known differences")
    phi = Phi3ForCausalLM(Phi3Config(**SHAPE, tie_word_embeddings=False, pad_token_id=None, bos_token_id=1,
                                     eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 250000.0}))
    dirs["phi3"] = os.path.join(TMP, "phi3")
    phi.save_pretrained(dirs["phi3"])
    return dirs


def hf(kind, d):
    return CLASSES[kind].from_pretrained(d, dtype=torch.float32).eval().double()


def windows(first, n):
    x = np.stack([TOKENS[(first + k) * T:(first + k) * T + T] for k in range(n)]).astype(np.int64)
    y = np.stack([TOKENS[(first + k) * T + 1:(first + k) * T + T + 1] for k in range(n)]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def loss_of(model, x, y):
    logits = model(input_ids=x).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def run(args, N=1):
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN] + args
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def config(name, src, steps=1, extra=None):
    cfg = {"model": {"from_pretrained": src},
           "data": {"train": DATA, "seq_len": T, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_micro_batch_size_per_gpu": B, "gradient_clipping": CLIP,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    return write_config(os.path.join(TMP, name + ".json"), cfg, extra)


def train(name, src, N, steps=1, extra=None, final=False):
    dump = os.path.join(TMP, name + ".dump")
    args = ["train", config(name, src, steps, extra), "--dump", dump]
    if final:
        args += ["--dump-final", dump + ".final"]
    r = run(args, N)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    if r.returncode != 0:
        return None
    return read_dump(dump), (read_dump(dump + ".final") if final else None)


# Phi-3's fused tensors as shardlm's parts (the dumps name the parts): the parts' rows one after the other
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def dumped(dump, prefix, name):
    """Tensor name of a transformers model out of a shardlm dump (prefix "grad." for gradients): a fused one joined
    from its parts, the embedding and LM head without the padded rows."""
    for whole, parts in FUSED.items():
        if name.endswith(whole):
            layer = name[:-len(whole)]
            got = [dump.get(prefix + layer + p) for p in parts]
            return None if any(g is None for g in got) else np.concatenate(got, axis=0)
    g = dump.get(prefix + name)
    return g[:V] if g is not None and name in ("model.embed_tokens.weight", "lm_head.weight") else g


def check_n1(kind, d):
    res = train(f"{kind}.N1", d, 1, STEPS, final=True)
    if res is None:
        return
    dump, final = res
    model = hf(kind, d)
    x, y = windows(0, B)
    logits, loss = loss_of(model, x, y)
    loss.backward()
    check(f"{kind}.N1.logits", rel(dump["logits"][..., :V], logits.detach().numpy()) <= TOL,
          f"rel {rel(dump['logits'][..., :V], logits.detach().numpy()):.2e}")
    e = rel(dump["loss"], np.array([loss.item()]))
    check(f"{kind}.N1.loss", e <= TOL, f"rel {e:.2e}")
    params = dict(model.named_parameters())
    bad, worst = [], 0.0
    for n, p in params.items():
        g = dumped(dump, "grad.", n)
        if g is None:
            bad.append(f"{n} not dumped")
            continue
        e = rel(g, p.grad.numpy())
        worst = max(worst, e)
        if not e <= GRAD_TOL:
            bad.append(f"{n} {e:.2e}")
    check(f"{kind}.N1.grads", not bad, f"{bad[:5]}")
    note(f"{kind}: max gradient rel err {worst:.2e} over {len(params)} tensors")
    # three AdamW steps, decay on the matrices only, clipping at CLIP
    model = hf(kind, d)
    ps = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for p in ps.values() if p.dim() == 2], "weight_decay": WD},
                             {"params": [p for p in ps.values() if p.dim() != 2], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        _, l_ = loss_of(model, *windows(s * B, B))
        l_.backward()
        torch.nn.utils.clip_grad_norm_(list(ps.values()), CLIP)
        opt.step()
        losses.append(l_.item())
    rows = [json.loads(line) for line in open(os.path.join(TMP, f"{kind}.N1.jsonl")) if '"loss"' in line]
    got = [r_["loss"] for r_ in rows]
    e = rel(np.array(got), np.array(losses)) if len(got) == STEPS else float("inf")
    check(f"{kind}.N1.adamw_losses", e <= GRAD_TOL, f"rel {e:.2e}: {got} vs {losses}")
    bad = []
    for n, p in ps.items():
        e = rel(dumped(final, "", n), p.detach().numpy())
        if not e <= 10 * GRAD_TOL:
            bad.append(f"{n} {e:.2e}")
    check(f"{kind}.N1.adamw_weights", not bad, f"{bad[:5]}")


def check_ranks(kind, d, model_kind):
    model = hf(model_kind, d)
    for N in (2, 3):
        extra = {"checkpoint": {"dir": os.path.join(TMP, f"ck_{kind}"), "export_hf": True}} if N == 2 else None
        res = train(f"{kind}.N{N}", d, N, extra=extra)
        if res is None:
            continue
        x, y = windows(0, N * B)
        with torch.no_grad():
            _, want = loss_of(model, x, y)
        got = float(res[0]["loss"].ravel()[0])
        e = abs(got - want.item()) / want.item()
        tol = TOL if "bf16" not in kind else 1e-5
        check(f"{kind}.N{N}.loss", e <= tol, f"{got} vs transformers {want.item()} (rel {e:.2e})")


def check_export(kind):
    out = os.path.join(TMP, f"ck_{kind}", "hf")
    if not os.path.exists(os.path.join(out, "config.json")):
        check(f"{kind}.export.written", False, "no export")
        return
    cfg = json.load(open(os.path.join(out, "config.json")))
    check(f"{kind}.export.architecture", cfg["architectures"] == [CLASSES[kind].__name__], f"{cfg['architectures']}")
    res = train(f"{kind}.reload", out, 1)
    if res is None:
        return
    x, y = windows(0, B)
    with torch.no_grad():
        _, want = loss_of(hf(kind, out), x, y)
    got = float(res[0]["loss"].ravel()[0])
    e = abs(got - want.item()) / want.item()
    check(f"{kind}.export.transformers_loss", e <= TOL, f"{got} vs {want.item()} (rel {e:.2e})")


def check_generate(kind, d):
    model = CLASSES[kind].from_pretrained(d, dtype=torch.float32).eval()
    check_greedy(f"{kind}.generate", d, model, [[3, 14, 15, 92, 65], list(range(40, 60))], 32, TOKENIZER, TMP)


def check_lora(kind, d):
    ck = os.path.join(TMP, f"lora_{kind}")
    shutil.rmtree(ck, ignore_errors=True)
    extra = {"lora": {"r": 4, "alpha": 8, "init": False, "target_modules": "all-linear"},
             "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
             "checkpoint": {"dir": ck, "export_hf": True}}
    res = train(f"{kind}.lora", d, 2, extra=extra)
    if res is None:
        return
    base = CLASSES[kind].from_pretrained(d, dtype=torch.float32)
    try:
        model = PeftModel.from_pretrained(base, os.path.join(ck, "hf")).double().eval()
    except Exception as e:  # noqa: BLE001
        check(f"{kind}.lora.peft_loads", False, f"{type(e).__name__}: {e}")
        return
    dump = res[0]
    with torch.no_grad():
        want = model(input_ids=torch.as_tensor(dump["inputs"], dtype=torch.int64)).logits.numpy()
    e = rel(dump["logits"][..., :V], want)
    check(f"{kind}.lora.peft_logits", e <= GRAD_TOL, f"rel {e:.2e}")


PHI3_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # PEFT's Phi3 targets: the fused modules


def peft_lora(kind, d, dump, targets):
    """PEFT's LoRA (r 4, alpha 8) on targets over the transformers base (float64) with shardlm's dumped adapters
    copied in; the map from PEFT's parameter names to shardlm's."""
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(hf(kind, d), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                                                init_lora_weights=False)).double()
    params, ours = dict(pm.named_parameters()), {}
    for name, w in dump.items():
        if ".lora_" in name and not name.startswith("grad."):
            module, part = name.rsplit(".lora_", 1)
            pname = f"base_model.model.{module}.lora_{part[0]}.default.weight"
            if pname in params:
                with torch.no_grad():
                    params[pname].copy_(torch.tensor(w, dtype=torch.float64))
            ours[pname] = name
    return pm, ours


def check_phi3_lora(d):
    """LoRA on Phi-3's fused modules (one A (r, C) and one B (Q + 2 KV, r) over q|k|v, as PEFT): at N = 1 three AdamW
    steps and at N = 2 one step at lr 0, each against PEFT 0.21 on transformers 5.25 (loss, every adapter's
    gradient); the N = 2 export loads with PEFT at shardlm's logits, and export --merge loads in transformers at
    PEFT's loss."""
    for N, steps, lr in ((1, STEPS, LR), (2, 1, 0.0)):
        name = f"phi3.lora_fused.N{N}"
        ck = os.path.join(TMP, f"ck_{name}")
        shutil.rmtree(ck, ignore_errors=True)
        extra = {"lora": {"r": 4, "alpha": 8, "init": False, "target_modules": PHI3_TARGETS},
                 "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": list(BETAS), "eps": EPS,
                                                           "weight_decay": WD}},
                 "checkpoint": {"dir": ck, "export_hf": N == 2}}
        res = train(name, d, N, steps, extra=extra)
        if res is None:
            continue
        dump = res[0]
        pm, ours = peft_lora("phi3", d, dump, PHI3_TARGETS)
        trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
        check(f"{name}.adapters_are_peft", trainable == set(ours) and len(ours) == 4 * 2 * SHAPE["num_hidden_layers"],
              f"PEFT {sorted(trainable - set(ours))[:3]}, shardlm {sorted(set(ours) - trainable)[:3]}")
        x, y = windows(0, N * B)
        _, loss = loss_of(pm, x, y)
        loss.backward()
        e = rel(dump["loss"], np.array([loss.item()]))
        check(f"{name}.loss", e <= TOL, f"rel {e:.2e}")
        params, bad, worst = dict(pm.named_parameters()), [], 0.0
        for pname, n in ours.items():
            g = dump.get("grad." + n)
            e = rel(g, params[pname].grad.numpy()) if g is not None and pname in params else float("inf")
            worst = max(worst, e)
            if not e <= TOL:  # measured 5e-6 (N = 1), 3e-6 (N = 2)
                bad.append(f"{n} {e:.2e}")
        check(f"{name}.adapter_grads", not bad and ours, f"{bad[:4]}")
        note(f"{name}: max adapter gradient rel err {worst:.2e} over {len(ours)} tensors")
        if N == 1:
            pm, ours = peft_lora("phi3", d, dump, PHI3_TARGETS)
            tp = [p for p in pm.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(tp, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
            losses = []
            for s_ in range(STEPS):
                opt.zero_grad()
                _, l_ = loss_of(pm, *windows(s_ * B, B))
                l_.backward()
                torch.nn.utils.clip_grad_norm_(tp, CLIP)
                opt.step()
                losses.append(l_.item())
            rows = [json.loads(line) for line in open(os.path.join(TMP, name + ".jsonl")) if '"loss"' in line]
            got = [r_["loss"] for r_ in rows]
            e = rel(np.array(got), np.array(losses)) if len(got) == STEPS else float("inf")
            check(f"{name}.adamw_losses", e <= GRAD_TOL, f"rel {e:.2e}: {got} vs {losses}")
            continue
        out = os.path.join(ck, "hf")
        try:
            cfg = json.load(open(os.path.join(out, "adapter_config.json")))
            check(f"{name}.export_targets", sorted(cfg["target_modules"]) == sorted(PHI3_TARGETS),
                  f"{cfg['target_modules']}")
            loaded = PeftModel.from_pretrained(CLASSES["phi3"].from_pretrained(d, dtype=torch.float32), out)
            loaded = loaded.double().eval()
        except Exception as e:  # noqa: BLE001
            check(f"{name}.export_peft_loads", False, f"{type(e).__name__}: {e}")
            continue
        with torch.no_grad():
            want = loaded(input_ids=torch.as_tensor(dump["inputs"], dtype=torch.int64)).logits.numpy()
            _, peft_loss = loss_of(loaded, x, y)
        e = rel(dump["logits"][..., :V], want)
        check(f"{name}.export_peft_logits", e <= GRAD_TOL, f"rel {e:.2e}")
        merged = os.path.join(TMP, f"{name}.merged")
        shutil.rmtree(merged, ignore_errors=True)
        r = run(["export", "--merge", ck, merged], 2)
        check(f"{name}.merge_runs", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-400:]}")
        if r.returncode != 0:
            continue
        with torch.no_grad():
            _, got = loss_of(hf("phi3", merged), x, y)
        e = abs(got.item() - peft_loss.item()) / peft_loss.item()
        check(f"{name}.merged_transformers_loss", e <= TOL, f"{got.item()} vs PEFT {peft_loss.item()} (rel {e:.2e})")


# LoRA-DPO (TRL's sigmoid loss, beta 0.1): random preference pairs, prompt untrained, completion trained
N_PAIRS, BETA = 4, 0.1
LINEARS = {"qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "phi3": PHI3_TARGETS}


def make_pairs():
    """[(chosen, rejected)] of (ids, trained) and the preference file shardlm reads (tools/prefdata.py's layout)."""
    import h5py
    from datafiles import set_str, write_samples
    rng = np.random.default_rng(48)
    pairs = []
    for _ in range(N_PAIRS):
        prompt = [int(t) for t in rng.integers(0, V, rng.integers(3, 8))]
        pairs.append([(prompt + c, [0] * len(prompt) + [1] * len(c))
                      for c in ([int(t) for t in rng.integers(0, V, rng.integers(3, 9))] for _ in range(2))])
    toks, trained, off = [], [], [0]
    for pair in pairs:
        for ids, tr in pair:
            toks, trained = toks + ids, trained + tr
            off.append(len(toks))
    path = write_samples(os.path.join(TMP, "pref.h5"), toks, trained, off, V)
    with h5py.File(path, "r+") as f:
        del f.attrs["format"]
        set_str(f, "format", "shardlm-preferences")
        f["prompt_lengths"] = np.array([p[0][1].index(1) for p in pairs], np.int64)
        f.attrs["max_prompt_length"] = np.int64(T)
    return pairs, path


def seq_logps(model, pairs):
    """[(chosen, rejected)] sums of log p of each trained token given the ones before (TRL's concatenated_forward)."""
    out = []
    for pair in pairs:
        row = []
        for ids, trained in pair:
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
            row.append(sum(lp[p - 1, ids[p]] for p in range(1, len(ids)) if trained[p]))
        out.append(row)
    return out


def dpo_loss(pol, ref):
    """TRL's DPOTrainer.dpo_loss, loss_type sigmoid: -logsigmoid(beta ((pi_c - pi_r) - (ref_c - ref_r))), mean."""
    z = [(c - r) - (rc - rr) for (c, r), (rc, rr) in zip(pol, ref)]
    return sum(-torch.nn.functional.logsigmoid(BETA * x) for x in z) / len(z), \
        float(sum(BETA * x.item() for x in z) / len(z))


def check_dpo(kind, d, pairs, pref, N=1):
    """One LoRA-DPO step (the reference: the base with the adapters off, in the same step) against PEFT 0.21 on
    transformers 5.25 with TRL's loss: the loss, rewards/margins, every adapter's gradient and the AdamW step's
    adapters. B random (lora.init false), so the policy is not the reference and z != 0."""
    name = f"{kind}.dpo_lora.N{N}"
    extra = {"data": {"train": pref, "seq_len": T, "shuffle": False},
             "dpo": {"beta": BETA, "ref_log_probs_path": os.path.join(TMP, name + ".ref.h5")},
             "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "init": False, "target_modules": LINEARS[kind]},
             "train_batch_size": N_PAIRS, "train_micro_batch_size_per_gpu": N_PAIRS // N}
    res = train(name, d, N, 1, extra=extra, final=True)
    if res is None:
        return
    dump, final = res
    pm, ours = peft_lora(kind, d, dump, LINEARS[kind])
    params = dict(pm.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    check(f"{name}.adapters_are_peft", trainable == set(ours), f"{sorted(trainable ^ set(ours))[:3]}")
    with torch.no_grad(), pm.disable_adapter():
        ref = [(float(c), float(r)) for c, r in seq_logps(pm, pairs)]
    loss, margin = dpo_loss(seq_logps(pm, pairs), ref)
    loss.backward()
    rows = [json.loads(line) for line in open(os.path.join(TMP, name + ".jsonl")) if '"loss"' in line]
    got = rows[0]["loss"] if rows else float("nan")
    e = abs(got - loss.item()) / loss.item()
    check(f"{name}.loss", e <= TOL and abs(loss.item() - np.log(2)) > 1e-3, f"{got} vs torch {loss.item()} (rel {e:.2e})")
    m = rows[0].get("rewards/margins", float("nan")) if rows else float("nan")
    check(f"{name}.margins", abs(m - margin) <= TOL * max(1.0, abs(margin)), f"{m} vs {margin}")
    worst = max((rel(dump.get("grad." + n), params[p].grad.numpy()) for p, n in ours.items()), default=float("inf"))
    check(f"{name}.adapter_grads", worst <= GRAD_TOL, f"rel {worst:.2e}")
    note(f"{name}: loss rel {e:.2e}, max adapter gradient rel err {worst:.2e} over {len(ours)} tensors")
    opt = torch.optim.AdamW([params[p] for p in ours], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    torch.nn.utils.clip_grad_norm_([params[p] for p in ours], CLIP)
    opt.step()
    e = max(rel(final[n], params[p].detach().numpy()) for p, n in ours.items())
    check(f"{name}.adamw_adapters", e <= 10 * GRAD_TOL, f"rel {e:.2e}")


# Chat templates (tests/hf_tokenizers.py): Qwen2.5's ChatML with its default system turn and tool calls, Phi-3's
CHATS = {
    "qwen2": [[{"role": "user", "content": "Hello, wie geht's? 你好"}, {"role": "assistant", "content": "Gut, danke."}],
              [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich <b>"}}}]},
               {"role": "tool", "content": "22°C"}, {"role": "assistant", "content": "It is 22°C."},
               {"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You're welcome."}]],
    # a multi-turn chat whose middle turns render without the reasoning block the last one has
    "qwen3": [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
               {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."}, {"role": "user", "content": "Und 3 + 3?"},
               {"role": "assistant", "content": "6", "reasoning_content": "three twice"}, {"role": "user", "content": "Danke"},
               {"role": "assistant", "content": "Bitte."}]],
    "phi3": [[{"role": "user", "content": "Hello, wie geht's? 你好"}, {"role": "assistant", "content": "Gut, danke."}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
              {"role": "assistant", "content": " 4."}, {"role": "user", "content": "And 3 + 3?\n"},
              {"role": "assistant", "content": "6"}]],
}


def chat_model(kind, d):
    """d with kind's tokenizer (320 tokens, trained on docs/DESIGN.md) and chat template, saved by transformers."""
    from transformers import PreTrainedTokenizerFast
    from hf_tokenizers import PHI3_TEMPLATE, QWEN25_TEMPLATE, QWEN3_LIKE_TEMPLATE, phi3_tokenizer, qwen2_tokenizer
    text = [open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()]
    out = os.path.join(TMP, f"{kind}_chat")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(d, out)
    if kind in ("qwen2", "qwen3"):
        tok = PreTrainedTokenizerFast(tokenizer_object=qwen2_tokenizer(text, V), eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>",
                                      chat_template=QWEN25_TEMPLATE if kind == "qwen2" else QWEN3_LIKE_TEMPLATE)
    else:
        tok = PreTrainedTokenizerFast(tokenizer_object=phi3_tokenizer(text, V), bos_token="<s>",
                                      eos_token="<|endoftext|>", unk_token="<unk>", pad_token="<|endoftext|>",
                                      chat_template=PHI3_TEMPLATE)
    tok.save_pretrained(out)
    return out, tok


def ids_of(encoded):
    """apply_chat_template(tokenize=True)'s ids: a list, or transformers 5's BatchEncoding."""
    return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)


def check_chat(kind, d):
    """The chat template rendered by prepare_data (training samples) and by generate (tools/chat_template.py, then
    the C tokenizer) against transformers 5.25's apply_chat_template: the text, the ids, the trained tokens, and
    greedy generation from the rendered prompt."""
    import h5py
    from transformers import AutoTokenizer
    out, _ = chat_model(kind, d)
    tok = AutoTokenizer.from_pretrained(out)
    chats = CHATS[kind]
    src = os.path.join(TMP, f"{kind}_chats.jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps({"messages": m}) + "\n" for m in chats)
    # generate's renderer: the prompt, the conversation before the last assistant turn
    prompts = [m[:max(i for i, x in enumerate(m) if x["role"] == "assistant")] for m in chats]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "chat_template.py"), "--tokenizer", out],
                       input="".join(json.dumps(p) + "\n" for p in prompts), capture_output=True, text=True, env=ENV)
    got = [json.loads(x) for x in r.stdout.splitlines()]
    want = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    check(f"chat.{kind}.generate_render", r.returncode == 0 and got == want, f"{r.stderr[-300:]} {got} vs {want}")
    h5 = os.path.join(TMP, f"{kind}_chats.h5")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", out, "-o", h5,
                        "--overwrite", src], capture_output=True, text=True, env=ENV)
    check(f"chat.{kind}.prepare_runs", r.returncode == 0, r.stderr[-400:])
    if r.returncode == 0:
        with h5py.File(h5, "r") as f:
            tokens, trained, offsets = f["tokens"][:], f["trained"][:], f["offsets"][:]
        for k, m in enumerate(chats):
            ids, mask = tokens[offsets[k]:offsets[k + 1]].tolist(), trained[offsets[k]:offsets[k + 1]].tolist()
            check(f"chat.{kind}.{k}.prepare_ids", ids == ids_of(tok.apply_chat_template(m, tokenize=True)),
                  f"{ids} vs {ids_of(tok.apply_chat_template(m, tokenize=True))}")
            runs, cur = [], []
            for i, t in zip(ids + [None], mask + [0]):
                if t:
                    cur.append(i)
                elif cur:
                    runs.append(tok.decode(cur))
                    cur = []
            # a tool call's content is empty; a <think> block that starts one is not rendered before the last user turn
            turns = [x["content"].split("</think>")[-1] for x in m if x["role"] == "assistant"]
            check(f"chat.{kind}.{k}.trained_turns", len(runs) == len(turns) and
                  all(c.strip() in run for c, run in zip(turns, runs)), f"{runs} for {turns}")
            if kind == "qwen3":  # the middle turns as the whole conversation renders them, the last with its block
                check(f"chat.{kind}.{k}.trained_text", runs == ["4.<|im_end|>\n", "6<|im_end|>\n",
                                                              "<think>\n\n</think>\n\nBitte.<|im_end|>\n"], f"{runs}")
    # generate: the rendered prompt through the C tokenizer, then greedy decoding, against transformers (the
    # conversations up to their first assistant turn: the model's context is 128)
    prompts = [m[:next(i for i, x in enumerate(m) if x["role"] == "assistant")] for m in chats]
    pf = os.path.join(TMP, f"{kind}_gen.jsonl")
    with open(pf, "w") as f:
        f.writelines(json.dumps({"messages": p}) + "\n" for p in prompts)
    r = run(["generate", out, "--prompt-file", pf, "--max-new-tokens", "8", "--ignore-eos", "--json"])
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.strip()] if r.returncode == 0 else []
    model = CLASSES[kind].from_pretrained(out, dtype=torch.float32).eval()
    for k, p in enumerate(prompts):
        ids = ids_of(tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True))
        with torch.no_grad():
            y = model.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)
        row = rows[k] if k < len(rows) else {}
        check(f"chat.{kind}.{k}.generate", row.get("prompt_tokens") == len(ids) and row.get("ids") == y[0, len(ids):]
              .tolist(), f"{r.stderr[-300:]} {row} vs {len(ids)} prompt tokens, {y[0, len(ids):].tolist()}")


def check_phi3_files(d):
    """The Phi-3 files hold the fused tensors only, and so does the export (byte for byte the same tensors after a
    step at lr 0); LoRA on the fused modules is refused."""
    from safetensors.torch import load_file
    src = load_file(os.path.join(d, "model.safetensors"))
    check("phi3.files_fused", "model.layers.0.self_attn.qkv_proj.weight" in src
          and not any("q_proj" in k or "gate_proj" in k for k in src), f"{sorted(src)[:6]}")
    ck = os.path.join(TMP, "ck_phi3_lr0")
    shutil.rmtree(ck, ignore_errors=True)
    res = train("phi3.lr0", d, 2, extra={"optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
                                         "checkpoint": {"dir": ck, "export_hf": True}})
    if res is not None:
        out = {}
        for f in os.listdir(os.path.join(ck, "hf")):
            if f.endswith(".safetensors"):
                out.update(load_file(os.path.join(ck, "hf", f)))
        same = out.keys() == src.keys() and all(torch.equal(out[k], src[k]) for k in src)
        check("phi3.export_roundtrip_bitwise", same, f"{sorted(set(out) ^ set(src))[:4]}")
    r = run(["train", config("phi3_lora_part", d, extra={"lora": {"r": 4, "target_modules": ["q_proj"]}})])
    lines = r.stderr.strip().splitlines()
    check("phi3.lora_part_refused", r.returncode == 2 and lines and "q_proj" in lines[-1] and "qkv_proj" in lines[-1],
          r.stderr[-300:])
    r = run(["train", config("phi3_lora_save_part", d, extra={"lora": {"r": 4, "target_modules": ["o_proj"],
                                                                       "modules_to_save": ["gate_proj"]}})])
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("shardlm:")]
    check("phi3.lora_save_part_refused", r.returncode == 2 and len(lines) == 1 and "gate_proj" in lines[0]
          and "gate_up_proj" in lines[0] and "target_modules" in lines[0], r.stderr[-300:])
    # o_proj is no part: it may be trained in full beside the adapters (one step runs)
    r = run(["train", config("phi3_lora_save_o", d, extra={"lora": {"r": 4, "target_modules": ["qkv_proj"],
                                                                    "modules_to_save": ["o_proj"]}})])
    check("phi3.lora_save_o_proj_runs", r.returncode == 0, r.stderr[-300:])


def grad_errors(dump, model):
    """[bad tensors], worst relative error of every gradient of a dump against the model's .grad."""
    bad, worst = [], 0.0
    for n, p in model.named_parameters():
        g = dumped(dump, "grad.", n)
        e = rel(g, p.grad.numpy()) if g is not None else float("inf")
        worst = max(worst, e)
        if not e <= GRAD_TOL:
            bad.append(f"{n} {e:.2e}")
    return bad, worst


def phi3_n1(name, rope, original, seed):
    """A Phi-3 of SHAPE with rope_parameters ROPE and original_max_position_embeddings ORIGINAL saved by transformers,
    one step at T with a checkpoint (exported) against transformers: logits, loss, every gradient. Returns (its
    directory, the checkpoint directory, the transformers model after backward, x, y, loss), None when the run
    failed."""
    torch.manual_seed(seed)
    cfg = Phi3Config(**SHAPE, original_max_position_embeddings=original, tie_word_embeddings=False, pad_token_id=None,
                     bos_token_id=1, eos_token_id=2, rope_parameters=rope)
    d = os.path.join(TMP, "phi3_" + name)
    Phi3ForCausalLM(cfg).save_pretrained(d)
    ck = os.path.join(TMP, "ck_" + name)
    shutil.rmtree(ck, ignore_errors=True)
    res = train(f"{name}.N1", d, 1, extra={"checkpoint": {"dir": ck, "export_hf": True}})
    if res is None:
        return None
    model = hf("phi3", d)
    x, y = windows(0, B)
    logits, loss = loss_of(model, x, y)
    loss.backward()
    e = rel(res[0]["logits"][..., :V], logits.detach().numpy())
    check(f"{name}.logits", e <= TOL, f"rel {e:.2e}")
    e = abs(float(res[0]["loss"].ravel()[0]) - loss.item()) / loss.item()
    check(f"{name}.loss", e <= TOL, f"rel {e:.2e}")
    bad, worst = grad_errors(res[0], model)
    check(f"{name}.grads", not bad, f"{bad[:5]}")
    note(f"{name}: max gradient rel err {worst:.2e}")
    return d, ck, model, x, y, loss


def check_phi3_reload(name, out, x, y):
    """The export OUT trained from at transformers' loss of it."""
    back = train(f"{name}.reload", out, 1)
    if back is not None:
        with torch.no_grad():
            _, want = loss_of(hf("phi3", out), x, y)
        e = abs(float(back[0]["loss"].ravel()[0]) - want.item()) / want.item()
        check(f"{name}.export_transformers_loss", e <= TOL, f"rel {e:.2e}")


def check_longrope():
    """Phi-3's longrope with original_max_position_embeddings = T / 2 (max_position_embeddings 128: cos and sin
    scaled by sqrt(1 + ln 8 / ln 16)) and random short and long factors."""
    rng = np.random.default_rng(3)
    half = SHAPE["hidden_size"] // SHAPE["num_attention_heads"] // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [float(x) for x in rng.uniform(1, 3, half)],
            "long_factor": [float(x) for x in rng.uniform(2, 6, half)]}
    short = T // 2
    # T past the original length: every row takes the long factors
    got = phi3_n1("longrope", rope, short, 5)
    if got is None:
        return
    d, ck, model, x, y, loss = got
    cfg = model.config
    # the long factors change the model: the short ones over the same T give a loss 100 tolerances away at least
    other_cfg = Phi3Config(**dict(cfg.to_dict(), rope_parameters=dict(rope, long_factor=rope["short_factor"])))
    other = Phi3ForCausalLM(other_cfg).double().eval().requires_grad_(False)
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        _, other_loss = loss_of(other, x, y)
    check("longrope.long.factors_matter", abs(other_loss.item() - loss.item()) > 100 * TOL * loss.item(),
          f"{other_loss.item()} vs {loss.item()}")
    # up to the original length: the short factors
    xs = torch.from_numpy(np.stack([TOKENS[k * short:k * short + short] for k in range(B)]).astype(np.int64))
    ys = torch.from_numpy(np.stack([TOKENS[k * short + 1:k * short + short + 1] for k in range(B)]).astype(np.int64))
    res_s = train("longrope.short", d, 1, extra={"data": {"seq_len": short}})
    if res_s is not None:
        with torch.no_grad():
            logits_s, loss_s = loss_of(hf("phi3", d), xs, ys)
        e = rel(res_s[0]["logits"][..., :V], logits_s.numpy())
        check("longrope.short.logits", e <= TOL, f"rel {e:.2e}")
    for N in (2, 3):
        res_n = train(f"longrope.N{N}", d, N)
        if res_n is None:
            continue
        with torch.no_grad():
            _, want = loss_of(hf("phi3", d), *windows(0, N * B))
        e = abs(float(res_n[0]["loss"].ravel()[0]) - want.item()) / want.item()
        check(f"longrope.N{N}.loss", e <= TOL, f"rel {e:.2e}")
    # eval on either side, and the export loaded back by transformers at the same loss
    for seq, xx, yy in ((T, x, y), (short, xs, ys)):
        with torch.no_grad():
            _, want = loss_of(hf("phi3", d), xx, yy)
        r = run(["eval", d, "--data", DATA, "--seq-len", str(seq), "--batch", "2", "--max-batches", "1", "--json"])
        got = json.loads(r.stdout.strip().splitlines()[-1])["loss"] if r.returncode == 0 else float("nan")
        e = abs(got - want.item()) / want.item()
        check(f"longrope.eval_{seq}", e <= TOL, f"{got} vs {want.item()} (rel {e:.2e}) {r.stderr[-300:]}")
    check_phi3_reload("longrope", os.path.join(ck, "hf"), x, y)
    check_longrope_generate(d)


def check_partial_rotary():
    """Phi-4-mini's layout: partial_rotary_factor 0.75 (the rotary turns 12 of a head's 16 channels, frequencies
    over those 12) with longrope of 6 factor pairs past original_max_position_embeddings 16: at T = 32 logits, loss,
    every gradient; N = 2 loss; the export (partial_rotary_factor kept) loaded back by transformers at the same
    loss; greedy generation across 16; refused: a factor whose channels are odd, and the key on Qwen2."""
    rng = np.random.default_rng(4)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [float(x) for x in rng.uniform(1, 3, 6)],
            "long_factor": [float(x) for x in rng.uniform(2, 6, 6)]}
    got = phi3_n1("partial", rope, T // 2, 6)
    if got is None:
        return
    d, ck, model, x, y, loss = got
    cfg = model.config
    # the same weights rotated whole (their longrope factors padded) give a loss 100 tolerances away at least
    whole = dict(rope, partial_rotary_factor=1.0, short_factor=rope["short_factor"] + [1.0, 1.0],
                 long_factor=rope["long_factor"] + [1.0, 1.0])
    other = Phi3ForCausalLM(Phi3Config(**dict(cfg.to_dict(), rope_parameters=whole))).double().eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        _, other_loss = loss_of(other, x, y)
    check("partial.rotation_matters", abs(other_loss.item() - loss.item()) > 100 * TOL * loss.item(),
          f"{other_loss.item()} vs {loss.item()}")
    res2 = train("partial.N2", d, 2)
    if res2 is not None:
        with torch.no_grad():
            _, want = loss_of(hf("phi3", d), *windows(0, 2 * B))
        e = abs(float(res2[0]["loss"].ravel()[0]) - want.item()) / want.item()
        check("partial.N2.loss", e <= TOL, f"rel {e:.2e}")
    out = os.path.join(ck, "hf")
    exported = json.load(open(os.path.join(out, "config.json"))) if os.path.exists(out) else {}
    check("partial.export.key", exported.get("rope_parameters", {}).get("partial_rotary_factor") == 0.75,
          f"{exported.get('rope_parameters')}")
    check_phi3_reload("partial", out, x, y)
    gen = Phi3ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    prompts = [[3, 14, 15, 92, 65], list(range(40, 54))]
    path, want = greedy_reference("partial", gen, prompts, 24)
    r = run(["generate", d, "--prompt-file", path, "--max-new-tokens", "24", "--ignore-eos", "--no-chat", "--batch",
             "2", "--tokenizer", TOKENIZER])
    got = [json.loads(line)["ids"] for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else None
    check("partial.generate.greedy", got == want, f"shardlm {got} vs transformers {want} {r.stderr[-300:]}")
    for name, src, edit, word in (("odd", d, {"partial_rotary_factor": 0.1}, "partial_rotary_factor"),
                                  ("qwen2", None, {"partial_rotary_factor": 0.5}, "Phi3ForCausalLM")):
        bd = os.path.join(TMP, "bad_partial_" + name)
        shutil.rmtree(bd, ignore_errors=True)
        if src:
            shutil.copytree(src, bd)
        else:
            qwen2(SHAPE).save_pretrained(bd)
        c = json.load(open(os.path.join(bd, "config.json")))
        c.update(edit)
        c.get("rope_parameters", {}).update(edit)
        json.dump(c, open(os.path.join(bd, "config.json"), "w"))
        r = run(["train", config("bad_partial_" + name, bd)])
        lines = r.stderr.strip().splitlines()
        check(f"partial.refused_{name}", r.returncode == 2 and len(lines) == 1 and word in lines[-1],
              f"exit {r.returncode}: {r.stderr[-300:]}")


def check_longrope_generate(d):
    """Greedy generation across original_max_position_embeddings (16): prompts of 3, 5, 14, 16 and 20 tokens and 24
    new ones, so rows cross it at different steps (the 16-token one at its first decode step, the 20-token one
    starts past it), 4 rows a forward (a row alone in its last round) at N = 1 and 2, and one at a time: each equal
    to transformers' generate of that prompt alone (which runs the sequence again at the crossing token)."""
    model = Phi3ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    prompts = [[7, 7, 8], [3, 14, 15, 92, 65], list(range(40, 54)), list(range(100, 116)), list(range(200, 220))]
    path, want = greedy_reference("longrope", model, prompts, 24)
    for N, batch in ((1, 4), (2, 4), (1, 1)):
        r = run(["generate", d, "--prompt-file", path, "--max-new-tokens", "24", "--ignore-eos", "--no-chat",
                 "--batch", str(batch), "--tokenizer", TOKENIZER], N)
        name = f"longrope.generate.N{N}.batch{batch}"
        check(f"{name}.run", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            continue
        got = [json.loads(line)["ids"] for line in r.stdout.splitlines() if line.strip()]
        differ = [i for i in range(len(prompts)) if i >= len(got) or got[i] != want[i]]
        check(f"{name}.greedy", not differ and len(got) == len(prompts),
              f"prompts {differ}: shardlm {[got[i] if i < len(got) else None for i in differ]} vs transformers "
              f"{[want[i] for i in differ]}")


def check_refused(dirs):
    cases = {"mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8},
                         ["mixture-of-experts"]),
             "phi3_yarn": ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
                           ["dynamic"])}
    for name, (edit, words) in cases.items():
        d = os.path.join(TMP, "bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(dirs["phi3" if "phi3" in name else "qwen2"], d)
        c = json.load(open(os.path.join(d, "config.json")))
        c.update(edit)
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
        r = run(["train", config("bad_" + name, d)])
        lines = r.stderr.strip().splitlines()
        check(f"refuse.{name}", r.returncode == 2 and lines and all(w in lines[-1] for w in words),
              f"exit {r.returncode}: {r.stderr[-300:]}")


def make_window_models():
    dirs = {}
    torch.manual_seed(1)
    mistral = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=WINDOW, tie_word_embeddings=False,
                                               pad_token_id=None))
    dirs["mistral"] = os.path.join(TMP, "mistral")
    mistral.save_pretrained(dirs["mistral"])
    q2 = qwen2(dict(SHAPE, num_hidden_layers=3), use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    dirs["qwen2w"] = os.path.join(TMP, "qwen2w")
    q2.save_pretrained(dirs["qwen2w"])
    cfg = json.load(open(os.path.join(dirs["qwen2w"], "config.json")))
    check("qwen2w.layer_types", cfg.get("layer_types") == ["full_attention"] + ["sliding_attention"] * 2,
          f"{cfg.get('layer_types')}")
    return dirs


def check_eval(kind, d):
    """`shardlm eval` over the first 4 windows of T tokens at the transformers model's loss, at N = 1 and 2 (one
    forward of 2 rows a rank)."""
    with torch.no_grad():
        _, want = loss_of(hf(kind, d), *windows(0, 4))
    for N in (1, 2):
        r = run(["eval", d, "--data", DATA, "--seq-len", str(T), "--batch", "2", "--max-batches", str(2 // N),
                 "--json"], N)
        check(f"{kind}.eval.N{N}.run", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            continue
        got = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
        e = abs(got - want.item()) / want.item()
        check(f"{kind}.eval.N{N}.loss", e <= TOL, f"{got} vs transformers {want.item()} (rel {e:.2e})")
    # the N = 2 run's checkpoint (its resolved config keeps the window: no config.json is read) at the loss of its
    # export in transformers
    ck = os.path.join(TMP, f"ck_{kind}")
    if os.path.exists(os.path.join(ck, "hf", "config.json")):
        r = run(["eval", ck, "--data", DATA, "--seq-len", str(T), "--batch", "2", "--max-batches", "2", "--json"])
        with torch.no_grad():
            _, want = loss_of(hf(kind, os.path.join(ck, "hf")), *windows(0, 4))
        got = json.loads(r.stdout.strip().splitlines()[-1])["loss"] if r.returncode == 0 else float("nan")
        e = abs(got - want.item()) / want.item()
        check(f"{kind}.eval.checkpoint", e <= TOL, f"{got} vs transformers {want.item()} (rel {e:.2e}) "
              f"{r.stderr[-300:] if r.returncode else ''}")


def greedy_reference(name, model, prompts, new):
    """The prompts as a prompt file (its path) and transformers' greedy tokens of each prompt alone."""
    path = os.path.join(TMP, name + "_prompts.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps({"ids": p}) + "\n" for p in prompts)
    want = []
    for p in prompts:
        with torch.no_grad():
            y = model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long), pad_token_id=0)
        want.append(y[0, len(p):].tolist())
    return path, want


def check_generate_ranks(kind, d):
    """`shardlm generate` at N = 2 and 3 (the model sharded, every rank decoding the prompts it holds) gives
    transformers' greedy tokens, 32 past prompts of 5 and 20 tokens: far past the window."""
    model = CLASSES[kind].from_pretrained(d, dtype=torch.float32).eval()
    prompts = [[3, 14, 15, 92, 65], list(range(40, 60)), [7, 7, 8]]
    path, want = greedy_reference(kind + "_ranks", model, prompts, 32)
    for N in (2, 3):
        r = run(["generate", d, "--prompt-file", path, "--max-new-tokens", "32", "--ignore-eos", "--no-chat",
                 "--tokenizer", TOKENIZER], N)
        check(f"{kind}.generate.N{N}.run", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            continue
        got = [json.loads(line)["ids"] for line in r.stdout.splitlines() if line.strip()]
        check(f"{kind}.generate.N{N}.greedy", got == want, f"shardlm {got} vs transformers {want}")


def check_packed_window(d):
    """A step over 8 samples packed 2 rows x 2 micro-batches equals the step over them one per micro-batch."""
    import datafiles  # tools/, on the path through harness
    rng = np.random.default_rng(9)
    lens = [30, 20, 10, 40, 25, 15, 50, 8]
    toks = [rng.integers(0, V, size=n) for n in lens]
    trained = [np.r_[np.zeros(3, np.uint8), np.ones(n - 3, np.uint8)] for n in lens]
    data = datafiles.write_samples(os.path.join(TMP, "packed_window.h5"), np.concatenate(toks),
                                   np.concatenate(trained), np.cumsum([0] + lens), V)
    steps = {}
    for name, micro, accum, extra in (("alone", 1, 8, {"pad_to_multiple_of": 1}), ("packed", 2, 2, {"packing": True})):
        dump = os.path.join(TMP, f"mistral.packed_{name}.dump")
        cfg = config(f"mistral.packed_{name}", d, extra={
            "data": dict({"train": data, "seq_len": 64}, **extra), "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accum})
        r = run(["train", cfg, "--dump", dump])
        check(f"mistral.packed_{name}.run", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            return
        steps[name] = read_dump(dump)
    a, b = steps["packed"], steps["alone"]
    e = abs(float(a["loss"][0]) - float(b["loss"][0])) / abs(float(b["loss"][0]))
    worst = max((rel(a[k], b[k]), k) for k in b if k.startswith("grad."))
    check("mistral.packed.loss", e <= TOL, f"rel {e:.2e}")
    check("mistral.packed.grads", worst[0] <= TOL, f"worst {worst[1]} rel {worst[0]:.2e}")


def check_windows():
    dirs = make_window_models()
    for kind in ("mistral", "qwen2w"):
        check_n1(kind, dirs[kind])
        check_ranks(kind, dirs[kind], kind)
        check_export(kind)
        check_generate(kind, dirs[kind])
        check_generate_ranks(kind, dirs[kind])
        check_eval(kind, dirs[kind])
    check_packed_window(dirs["mistral"])
    out = os.path.join(TMP, "ck_qwen2w", "hf", "config.json")
    if os.path.exists(out):
        c = json.load(open(out))
        check("qwen2w.export.window", c.get("use_sliding_window") is True and c.get("sliding_window") == WINDOW
              and c.get("layer_types") == ["full_attention"] + ["sliding_attention"] * 2,
              f"{[c.get(k) for k in ('use_sliding_window', 'sliding_window', 'layer_types')]}")
    # without layer_types the sliding layers are those from max_window_layers on (1: layers 1 and 2; 0: all)
    for mwl in (1, 0):
        d = edited_copy(dirs["qwen2w"], f"qwen2w_mwl{mwl}", {"max_window_layers": mwl}, drop="layer_types")
        res = train(f"qwen2w.max_window_layers_{mwl}", d, 1)
        if res is not None:
            with torch.no_grad():
                _, want = loss_of(hf("qwen2w", d), *windows(0, B))
            e = abs(float(res[0]["loss"].ravel()[0]) - want.item()) / want.item()
            check(f"qwen2w.max_window_layers_{mwl}.loss", e <= TOL, f"rel {e:.2e}")
    for name, src, edit, drop, words in (
            ("max_window_layers", "qwen2w", {"max_window_layers": -1}, "layer_types", ["max_window_layers"]),
            ("sliding_window_0", "mistral", {"sliding_window": 0}, None, ["sliding_window"]),
            ("layer_types", "qwen2w", {"layer_types": ["sliding_attention"] * 2}, None, ["layer_types"])):
        d = edited_copy(dirs[src], "bad_" + name, edit, drop=drop)
        r = run(["train", config("bad_" + name, d)])
        lines = r.stderr.strip().splitlines()
        check(f"refuse.{name}", r.returncode == 2 and lines and all(w in lines[-1] for w in words),
              f"exit {r.returncode}: {r.stderr[-300:]}")
    # the window as shardlm's own keys, for a model without config.json: layers out of range refused
    r = run(["train", config("bad_sliding_layers", dirs["mistral"], extra={
        "model": {"from_pretrained": None, "type": "llama", "n_layer": 2, "n_head": 4, "n_embd": 64, "ffn_dim": 96,
                  "vocab_size": V, "n_positions": 128, "sliding_window": 8, "sliding_layers": [1, 2]}})])
    lines = r.stderr.strip().splitlines()
    check("refuse.sliding_layers", r.returncode == 2 and lines and "model.sliding_layers[1]" in lines[-1],
          f"exit {r.returncode}: {r.stderr[-300:]}")


def edited_copy(src, name, edit, drop=None):
    """A copy of model directory src with config.json updated by edit (and key drop removed)."""
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d)
    c = json.load(open(os.path.join(d, "config.json")))
    c.update(edit)
    c.pop(drop, None)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    return d


TOKENIZER = None


def main():
    global TOKENIZER
    TOKENIZER = byte_bpe_tokenizer(os.path.join(TMP, "tokenizer.json"), V)
    if sys.argv[1:] == ["window"]:
        check_windows()
        sys.exit(1 if failures() else 0)
    if sys.argv[1:] == ["longrope"]:
        check_longrope()
        check_partial_rotary()
        sys.exit(1 if failures() else 0)
    dirs = make_models()
    for kind in ("qwen2", "qwen3", "phi3"):
        check_n1(kind, dirs[kind])
        check_ranks(kind, dirs[kind], kind)
        check_export(kind)
        check_generate(kind, dirs[kind])
        if kind != "phi3":
            check_lora(kind, dirs[kind])
    check_phi3_files(dirs["phi3"])
    check_phi3_lora(dirs["phi3"])
    pairs, pref = make_pairs()
    for kind in ("qwen2", "qwen3", "phi3"):
        check_dpo(kind, dirs[kind], pairs, pref)
    check_dpo("phi3", dirs["phi3"], pairs, pref, N=2)
    for kind in ("qwen2", "qwen3", "phi3"):
        check_chat(kind, dirs[kind])
    check_longrope()
    check_partial_rotary()
    check_ranks("qwen2_bf16", dirs["qwen2_bf16"], "qwen2")
    check_windows()
    check_refused(dirs)
    sys.exit(1 if failures() else 0)


if __name__ == "__main__":
    main()
