#!/usr/bin/env python3
"""t_qlora — a QLoRA step (issue 50) against PEFT over bitsandbytes' Linear4bit
on the CPU: transformers 5.25, PEFT 0.21.2 and bitsandbytes 0.50.2 in
build/ref5-venv (the script re-executes itself there).

A random Llama (d 64, 4 heads of 16, 2 key/value heads, SwiGLU 256, 2 layers,
vocabulary 128) is saved by transformers in fp32. shardlm trains from that
directory with a quantization section and LoRA on every linear layer
(lora.init false: B nonzero from the start), ZeRO stage 3, a global batch of
6 windows of 16 tokens (micro-batch 1 per rank), and dumps the first step.
The reference loads the same directory with
BitsAndBytesConfig(load_in_4bit=True, ...) on the CPU (every block linear
becomes a Linear4bit), wraps it with PEFT (init_lora_weights=False), sets the
adapters to shardlm's dumped ones and runs the same 6 windows in fp32.

  weights.*      every block linear weight shardlm computes with equals
                 bitsandbytes' dequantize_4bit of that layer's packed weight,
                 bit for bit (the rest of the base equals the file)
  sensitivity    the unquantized model's loss differs from the 4-bit one by
                 more than 10 TOL, so a run that skipped the quantization (or
                 quantized another way) fails loss.*
  loss.*         shardlm's step loss equals PEFT's within TOL (relative)
  grads.*        every LoRA gradient within TOL (max |a - b| / max |b| per tensor)
Cases: nf4 with double quantization at N = 1, 2, 3 (each rank quantizes the
same whole tensors), fp4 without it at N = 2.
  bf16_offload.*  nf4 in bf16 with offload_param and offload_optimizer at N = 2:
                  the weights are the fp32 case's rounded once to bf16, the loss
                  within 1e-2 of the fp32 case's
  dpo.*           LoRA-DPO (sigmoid, beta 0.1) on the 4-bit base at N = 2, 4
                  pairs: the loss and every adapter gradient equal TRL's formula
                  over PEFT on the bitsandbytes model, its reference the same
                  model with the adapters disabled (within TOL)
  resume.bitwise  nf4 at N = 2, 4 steps with a checkpoint every 2: stopped
                  at 2 and resumed (--resume auto), the final adapters equal
                  the uninterrupted run's bit for bit
  seeded.*        a QLoRA run from the seeded init (no from_pretrained) at
                  N = 2 with a checkpoint: eval of it at N = 1 and 2 (the base
                  quantized again, its checksum the run's), the same loss
  qdir.*          the 4-bit model saved by transformers (save_pretrained of the
                  BitsAndBytesConfig model): its files hold NAME.weight,
                  .absmax, .quant_map, .nested_absmax, .nested_quant_map and
                  .quant_state.bitsandbytes__nf4; shardlm reads it (no
                  quantization section: taken from its config.json) at N = 1
                  and 2, its block weights bit for bit those quantized from the
                  fp32 directory, and the step-1 loss (adapters B = 0) equals
                  transformers' loss of the 4-bit model within TOL; the same
                  saved with bnb_4bit_quant_storage bfloat16 and float32 (the
                  packed weight a BF16 / F32 tensor of the same bytes) at N = 2; a quant
                  state whose shape does not match its weight, and directories
                  whose quantization_config is GPTQ, AWQ or GGUF: one line,
                  exit 2
  export.*        a step at lr 0 with checkpoint.export_hf at N = 1 and 2: the
                  base's checksum (of its 4-bit values) the same at both;
                  peft.PeftModel.from_pretrained(the bitsandbytes model,
                  ckpt/hf) gives shardlm's logits; `shardlm export --merge`
                  (N = 2) writes dequantize_4bit(W) + (alpha / r) B A for every
                  adapted layer (what PEFT's merge of a Linear4bit adds before
                  it quantizes again; rel 1e-6) and the PEFT model's logits
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("qlora.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from harness import (BIN, ENV, check, failures, memory_binary, peft_set_adapters, read_dump, rel,  # noqa: E402
                     scratch_dir,
                     write_preferences, write_shard)

TMP = scratch_dir("t_qlora")
torch.set_num_threads(1)
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()

V, T, ROWS = 128, 16, 6
R, ALPHA = 4, 8.0
# fp32 against fp32: the same dequantized weights, matmuls summed in other orders
TOL = 1e-4
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

torch.manual_seed(7)
HF = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 initializer_range=0.05)
BASE = os.path.join(TMP, "base")
LlamaForCausalLM(HF).float().save_pretrained(BASE)

rng = np.random.default_rng(5)
TOKENS = rng.integers(0, V, 40 * T + 1)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)
X = torch.from_numpy(np.stack([TOKENS[i * T:i * T + T] for i in range(ROWS)]).astype(np.int64))
Y = torch.from_numpy(np.stack([TOKENS[i * T + 1:i * T + T + 1] for i in range(ROWS)]).astype(np.int64))


def config(name, qtype, double, steps=1, extra=None, base=None):
    cfg = {
        "model": {"from_pretrained": base or BASE},
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "seed": 5,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": ROWS, "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "lora": {"r": R, "alpha": ALPHA, "target_modules": "all-linear", "init": False},
        "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": qtype, "bnb_4bit_use_double_quant": double,
                         "bnb_4bit_compute_dtype": "float32"},
    }
    cfg.update(extra or {})
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def train(name, path, ranks, args=()):
    dump, final = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    resuming = "--resume" in args
    cmd = [BIN, "train", path] + ([] if resuming else ["--dump", dump]) + ["--dump-final", final, "--quiet", *args]
    if ranks > 1:
        cmd = ["mpirun", "-q", "-np", str(ranks)] + cmd
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = r.stdout.decode(errors="replace")
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {out[-800:]}")
    if r.returncode != 0:
        return None, None
    return (None if resuming else read_dump(dump)), read_dump(final)


def reference(qtype, double):
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qtype, bnb_4bit_use_double_quant=double,
                           bnb_4bit_compute_dtype=torch.float32)
    return LlamaForCausalLM.from_pretrained(BASE, quantization_config=q, dtype=torch.float32, device_map="cpu",
                                            use_kernels=False)


def loss_of(model):
    logits = model(input_ids=X).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), Y.reshape(-1))


def check_case(name, qtype, double, ranks):
    dump, _ = train(name, config(name, qtype, double), ranks)
    if dump is None:
        return
    model = reference(qtype, double)
    # the weights shardlm computes with: bitsandbytes' dequantized 4-bit weights, bit for bit
    bad = []
    for layer in range(HF.num_hidden_layers):
        for lin in LINEARS:
            mod = model.model.layers[layer].self_attn if lin.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) \
                else model.model.layers[layer].mlp
            w = getattr(mod, lin).weight
            want = bnbf.dequantize_4bit(w, w.quant_state).float().numpy()
            key = f"model.layers.{layer}.{'self_attn' if mod is model.model.layers[layer].self_attn else 'mlp'}." \
                  f"{lin}.weight"
            got = dump.get(key)
            if got is None or got.shape != want.shape or not np.array_equal(got.view(np.uint32),
                                                                             want.view(np.uint32)):
                bad.append(key)
    check(f"weights.{name}", not bad, f"{len(bad)} differ: {bad[:3]}")
    pm = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=LINEARS,
                                          init_lora_weights=False))
    params = dict(pm.named_parameters())
    ours = peft_set_adapters(pm, dump)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    check(f"adapters.{name}", trainable == set(ours) and ours, f"{sorted(trainable ^ set(ours))[:3]}")
    loss = loss_of(pm)
    loss.backward()
    e = rel(dump["loss"], np.array([loss.item()]))
    check(f"loss.{name}", e <= TOL, f"{dump['loss']} vs {loss.item()}: rel {e:.3e}")
    worst, bad = 0.0, []
    for pname, n in ours.items():
        g = dump.get("grad." + n)
        e = rel(g, params[pname].grad.numpy()) if g is not None else float("inf")
        worst = max(worst, e)
        if not e <= TOL:
            bad.append(f"{n} {e:.2e}")
    check(f"grads.{name}", not bad, f"{bad[:4]}")
    print(f"# {name}: loss {dump['loss'][0]:.7f} (PEFT {loss.item():.7f}), worst LoRA gradient rel {worst:.2e} "
          f"over {len(ours)} tensors", flush=True)
    return loss.item()



def q4_tensor_bytes(blocks, ranks, double):
    """One rank's bytes of a weight of `blocks` 64-blocks (zero.h's struct q4_layout): ceil(blocks / N) blocks at 32
    bytes of codes each, then a 4-byte absmax each, or with double quantization bitsandbytes' nested form: a byte
    each (padded to 4), an fp32 nested absmax for each group of 256 blocks the rank's blocks touch (the most any
    rank touches) and the fp32 offset."""
    per = -(-blocks // ranks)
    if not double:
        return per * 36
    touched = max((min(blocks, (r + 1) * per) - 1) // 256 - r * per // 256 + 1
                  for r in range(ranks) if r * per < blocks)
    return per * 32 + -(-per // 4) * 4 + (touched + 1) * 4


def q4_shard_bytes(ranks, double=True):
    """A block's shard at N ranks as zero.h's struct q4_layout lays it out: each linear weight in whole 64-blocks of
    the whole tensor (q4_tensor_bytes); the two norms (the plain part) padded to N * 16 elements, fp32; the shard
    rounded up to 16 bytes. Also the block's fp32 shard without quantization (its padded elements / N x 4)."""
    C, F, KV = HF.hidden_size, HF.intermediate_size, HF.hidden_size // HF.num_attention_heads * HF.num_key_value_heads
    linears = [C * C, KV * C, KV * C, C * C, F * C, F * C, C * F]
    q4 = sum(q4_tensor_bytes(-(-n // 64), ranks, double) for n in linears)
    plain = -(-(2 * C) // (ranks * 16)) * 16
    padded = -(-(sum(linears) + 2 * C) // (ranks * 16)) * ranks * 16
    return -(-(q4 + plain * 4) // 16) * 16, padded // ranks * 4


def arena(b):
    return -(-b // 64) * 64


def check_storage(ranks):
    """The blocks stored and gathered in 4 bits: the run's parameter shards, gathered slots and all-gather bytes
    are the LoRA run's with each block's fp32 shard replaced by its 4-bit one (computed here), and the run
    allocated what its plan said."""
    name = f"nf4_dq.n{ranks}"
    rows = [json.loads(line) for line in open(os.path.join(TMP, name + ".jsonl")) if line.strip()]
    step = next((r for r in rows if "loss" in r), None)
    mem = next((r["memory"] for r in rows if "memory" in r), None)
    path = os.path.join(TMP, name + ".lora.json")
    cfg = json.load(open(os.path.join(TMP, name + ".json")))
    del cfg["quantization"]
    json.dump(cfg, open(path, "w"))
    r = subprocess.run([BIN, "plan", path, "--ranks", str(ranks), "--target", "cpu", "--json"], env=ENV,
                       capture_output=True, text=True, timeout=60)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if step is None or mem is None or r.returncode != 0 or not lines:
        check(f"storage.{name}", False, f"metrics or LoRA plan missing: rc {r.returncode} {r.stderr[-300:]}")
        return
    lora = json.loads(lines[-1])
    q4, f32 = q4_shard_bytes(ranks)
    L, accum = HF.num_hidden_layers, ROWS // ranks
    want = lora["memory"]["parameter shard"]["bytes"] - L * arena(f32) + L * arena(q4)
    got = mem["parameter shard"]["peak"]
    check(f"storage.{name}.param_shard", got == want and mem["parameter shard"]["planned"] == want,
          f"peak {got}, planned {mem['parameter shard']['planned']}, want {want}")
    # the LoRA run's slots (the prefetch counts elements), each the N 4-bit shards instead of an fp32 block
    slots = (lora["memory"]["gathered units"]["bytes"] - mem["gathered units"]["peak"]) / (
        arena(ranks * f32) - arena(ranks * q4))
    check(f"storage.{name}.gathered_4bit_slots", slots == int(slots) and slots >= 1,
          f"{mem['gathered units']['peak']} vs LoRA {lora['memory']['gathered units']['bytes']}: {slots} slots")
    # every block gathered for forward and again for backward, each micro-batch: (N - 1) x its shard
    want = lora["bytes_allgather"] - L * 2 * accum * (ranks - 1) * (f32 - q4)
    check(f"storage.{name}.allgather_bytes", step["bytes_allgather"] == want,
          f"{step['bytes_allgather']} vs {want} (LoRA {lora['bytes_allgather']})")
    bad = [k for k, v in mem.items() if v["planned"] != v["peak"]]
    check(f"storage.{name}.planned_is_peak", not bad, f"{bad}")
    if ranks == 2:
        # double quantization's nested form against fp4.n2's fp32 absmax (the same layout otherwise): each rank's
        # stored shards shrink by 3 bytes a block, less the nested absmax and offset
        single = next((r["memory"] for r in (json.loads(line) for line in open(os.path.join(TMP, "fp4.n2.jsonl"))
                                             if line.strip()) if "memory" in r), {})
        plain = q4_shard_bytes(ranks, double=False)[0]
        saved = single.get("parameter shard", {}).get("peak", 0) - mem["parameter shard"]["peak"]
        check(f"storage.{name}.nested_saves", saved == L * (arena(plain) - arena(q4)) and saved > 0,
              f"{saved} B less than fp4.n2's shards, want {L * (arena(plain) - arena(q4))}")
        print(f"# {name}: a block's shard {q4} B with the nested absmax, {plain} B with fp32 absmax", flush=True)
    print(f"# {name}: a block's shard {q4} B in 4 bits (fp32: {f32} B); all-gather {step['bytes_allgather']} B a "
          f"step (LoRA: {lora['bytes_allgather']} B)", flush=True)


SMOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "models",
                    "SmolLM2-135M-Instruct")
# What a rank may hold while it reads beyond its planned buffers and the process itself (measured on the tiny
# base): the reader's buffers and the page cache's share of the files in VmHWM. One unit in the source dtype
# comes on top (the engine's read scratch).
LOAD_ALLOWANCE = 32 << 20


def init_peak(name, base, quantized):
    """A 1-step QLoRA (or LoRA) run at N = 2 of base: (each rank's VmHWM after the parameters' init, the run's
    planned bytes over every class), in bytes."""
    extra = {"bf16": {"enabled": True}, "train_batch_size": 2}
    path = config(name, "nf4", True, extra=extra, base=base)
    cfg = json.load(open(path))
    if quantized:
        cfg["quantization"]["bnb_4bit_compute_dtype"] = "bfloat16"
    else:
        del cfg["quantization"]
    json.dump(cfg, open(path, "w"))
    r = subprocess.run(["mpirun", "-q", "-np", "2", memory_binary(), "train", path], env=ENV, capture_output=True,
                       text=True, timeout=300)
    m = re.search(r"peak host memory per rank after the parameters' init \(KiB\): ([\d ]+)", r.stderr + r.stdout)
    rows = [json.loads(line) for line in open(os.path.join(TMP, name + ".jsonl")) if line.strip()] \
        if r.returncode == 0 else []
    mem = next((row["memory"] for row in rows if "memory" in row), None)
    if not m or mem is None:
        check(f"loading.{name}.run", False, f"rc {r.returncode}: {r.stderr[-400:]}")
        return None, None
    return [int(k) * 1024 for k in m.group(1).split()], sum(v["planned"] for v in mem.values())


def check_loading_memory():
    """Each rank's host memory while the base is read: SmolLM2-135M (538 MB of fp32) at N = 2, bf16. Beyond
    the process (the tiny base's run) and its planned buffers (4-bit shards included), a rank holds at most one
    unit in the source dtype (the largest, the embedding) and LOAD_ALLOWANCE; and less than LoRA's run."""
    if not os.path.isdir(SMOL):
        print(f"# loading: {SMOL} is not here; skipped", flush=True)
        return
    tiny, tiny_plan = init_peak("loading.tiny", BASE, True)
    q, q_plan = init_peak("loading.qlora", SMOL, True)
    lo, lo_plan = init_peak("loading.lora", SMOL, False)
    if None in (tiny, q, lo):
        return
    hf = json.load(open(os.path.join(SMOL, "config.json")))
    unit = hf["vocab_size"] * hf["hidden_size"] * 4  # the embedding in fp32, the files' dtype
    over = [(p - q_plan) - (t - tiny_plan) for p, t in zip(q, tiny)]
    check("loading.qlora_bound", all(o <= unit + LOAD_ALLOWANCE for o in over),
          f"beyond the plan and the process: {[o >> 20 for o in over]} MiB > {(unit + LOAD_ALLOWANCE) >> 20} MiB")
    check("loading.qlora_below_lora", max(q) < min(lo), f"QLoRA {[k >> 20 for k in q]} MiB, LoRA "
          f"{[k >> 20 for k in lo]} MiB")
    print(f"# loading SmolLM2-135M, N = 2, bf16: VmHWM after init per rank QLoRA {[k >> 20 for k in q]} MiB "
          f"(planned {q_plan >> 20} MiB), LoRA {[k >> 20 for k in lo]} MiB (planned {lo_plan >> 20} MiB); "
          f"beyond plan and process {[o >> 20 for o in over]} MiB (bound {(unit + LOAD_ALLOWANCE) >> 20} MiB)",
          flush=True)

def check_bf16_offload(fp32_loss):
    """bf16 with parameters and optimizer offloaded: the 4-bit weights rounded once to bf16."""
    extra = {"bf16": {"enabled": True},
             "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
                                   "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    path = config("bf16_offload.n2", "nf4", True, extra=extra)
    cfg = json.load(open(path))
    cfg["quantization"]["bnb_4bit_compute_dtype"] = "bfloat16"
    json.dump(cfg, open(path, "w"))
    dump, _ = train("bf16_offload.n2", path, 2)
    if dump is None:
        return
    ref = read_dump(os.path.join(TMP, "nf4_dq.n1.dump"))
    linear = [k for k in ref if k.startswith("model.layers.") and k.endswith("_proj.weight")]
    same = all(np.array_equal(dump[k], torch.from_numpy(ref[k]).to(torch.bfloat16).float().numpy()) for k in linear)
    check("bf16_offload.weights", linear and same, "the bf16 weights are not the fp32 4-bit values rounded once")
    rows = [json.loads(line) for line in open(os.path.join(TMP, "bf16_offload.n2.jsonl")) if line.strip()]
    mem = next((r["memory"] for r in rows if "memory" in r), {})
    shard = mem.get("parameter shard", {})
    q4, _ = q4_shard_bytes(2)
    q4 -= -(-(2 * HF.hidden_size) // 32) * 16 * 2  # the norms in bf16, not fp32
    # every unit's shard in pinned host memory, the blocks' in 4 bits: below the bf16 blocks' shards alone
    check("bf16_offload.pinned_4bit_shards", shard.get("space") == "pinned host" and
          shard.get("peak") == shard.get("planned") and
          HF.num_hidden_layers * q4 <= shard.get("peak", 0) < HF.num_hidden_layers * q4_shard_bytes(2)[1] // 2,
          f"{shard}")
    e = rel(dump["loss"], np.array([fp32_loss]))
    check("bf16_offload.loss", e <= 1e-2, f"{dump['loss']} vs fp32 {fp32_loss}: rel {e:.2e}")
    # offload_param "nvme": the other units' shards in the parameter file, the 4-bit shards kept in pinned memory
    cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": TMP}
    nvme_path = os.path.join(TMP, "bf16_offload_nvme.n2.json")
    json.dump(cfg, open(nvme_path, "w"))
    nvme, _ = train("bf16_offload_nvme.n2", nvme_path, 2)
    if nvme is not None:
        keys = [k for k in dump if ".lora_" in k or k == "loss"]
        check("bf16_offload.nvme_same", keys and all(np.array_equal(nvme[k], dump[k]) for k in keys),
              "offload_param nvme differs from cpu")


DPO_BETA = 0.1


def seq_logps(model, pairs):
    """[(chosen, rejected)] summed log p of each pair's trained tokens."""
    out = []
    for pair in pairs:
        row = []
        for ids, trained in pair:
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            row.append(sum(lp[p - 1, ids[p]] for p in range(1, len(ids)) if trained[p]))
        out.append(row)
    return out


def check_dpo():
    """LoRA-DPO on the 4-bit base: the reference is the 4-bit base with the adapters off (TRL's sigmoid loss)."""
    rng = np.random.default_rng(9)
    pairs = []
    for _ in range(4):
        prompt = [int(t) for t in rng.integers(0, V, 4)]
        pairs.append([(prompt + [int(t) for t in rng.integers(0, V, 5 + k)], [0] * 4 + [1] * (5 + k))
                      for k in range(2)])
    pref = write_preferences(os.path.join(TMP, "pref.h5"), pairs, V)
    path = config("dpo.n2", "nf4", True, extra={"train_batch_size": 4, "dpo": {"beta": DPO_BETA}})
    cfg = json.load(open(path))
    cfg["data"] = {"train": pref, "seq_len": T, "shuffle": False}
    json.dump(cfg, open(path, "w"))
    dump, _ = train("dpo.n2", path, 2)
    if dump is None:
        return
    rows = [r for r in (json.loads(line) for line in open(os.path.join(TMP, "dpo.n2.jsonl")) if line.strip())
            if "loss" in r]
    pm = get_peft_model(reference("nf4", True), LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                                            target_modules=LINEARS, init_lora_weights=False))
    params, ours = dict(pm.named_parameters()), peft_set_adapters(pm, dump)
    with torch.no_grad(), pm.disable_adapter():
        ref = seq_logps(pm, pairs)
    pol = seq_logps(pm, pairs)
    z = [(c - r) - (rc - rr) for (c, r), (rc, rr) in zip(pol, ref)]
    loss = sum(-torch.nn.functional.logsigmoid(DPO_BETA * x) for x in z) / len(z)
    loss.backward()
    e = abs(rows[0]["loss"] - loss.item()) / abs(loss.item())
    check("dpo.loss", e <= TOL and abs(loss.item() - np.log(2)) > 1e-4, f"{rows[0]['loss']} vs {loss.item()}")
    worst = max(rel(dump["grad." + n], params[p].grad.numpy()) for p, n in ours.items())
    check("dpo.grads", worst <= TOL, f"rel {worst:.3e}")


def check_sensitivity(quantized_loss):
    model = LlamaForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    pm = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=LINEARS, init_lora_weights=False))
    peft_set_adapters(pm, read_dump(os.path.join(TMP, "nf4_dq.n1.dump")))
    with torch.no_grad():
        plain = loss_of(pm).item()
    e = abs(plain - quantized_loss) / abs(quantized_loss)
    check("sensitivity", e > 10 * TOL, f"unquantized loss {plain} vs 4-bit {quantized_loss}: rel {e:.2e}")


def check_resume():
    ck = os.path.join(TMP, "resume_ck")
    extra = {"checkpoint": {"dir": ck, "every": 2}}
    _, full = train("resume.full", config("resume.full", "nf4", True, steps=4, extra=extra), 2)
    if full is None:
        return
    for f in os.listdir(ck):
        if f.startswith("step_000004"):
            os.remove(os.path.join(ck, f))
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("step_000002.h5\n")
    import h5py
    with h5py.File(os.path.join(ck, "step_000002.h5"), "r") as f:
        saved = sorted(f["master"].keys()) if "master" in f else []
    # the frozen 4-bit base is not saved (the checkpoint names the base by its checksum): the adapters alone
    check("resume.adapters_only", saved and all(".lora_" in k for k in saved) and
          len(saved) == 2 * len(LINEARS) * HF.num_hidden_layers, f"{len(saved)} datasets: {saved[:3]}")
    _, res = train("resume.same", config("resume.same", "nf4", True, steps=4, extra=extra), 2,
                   args=["--resume", "auto"])
    if res is None:
        return
    a = {k: v for k, v in full.items() if ".lora_" in k}
    check("resume.bitwise", a and all(np.array_equal(res[k], a[k]) for k in a),
          "final adapters differ from the run without a stop")
    # eval of the QLoRA checkpoint: its base quantized again as it is read (the checksum agrees) at any N
    check_eval_any_n("resume", ck)


def check_eval_any_n(name, ck):
    """`shardlm eval` of checkpoint ck at N = 1 and 2: both run (the base's checksum agrees), the same loss."""
    losses = []
    for n in (1, 2):
        r = subprocess.run(["mpirun", "-q", "-np", str(n), BIN, "eval", ck, "--data", DATA], env=ENV,
                           capture_output=True, text=True, timeout=300)
        m = re.search(r": loss ([0-9.]+) ", r.stdout + r.stderr)
        losses.append(float(m.group(1)) if r.returncode == 0 and m else None)
        if losses[-1] is None:
            check(f"{name}.eval_n{n}", False, f"rc {r.returncode}: {(r.stdout + r.stderr)[-400:]}")
    if None not in losses:
        check(f"{name}.eval_any_n", abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[0]), f"{losses}")


def check_seeded_eval():
    """A QLoRA run from the seeded init (no model.from_pretrained): eval of its checkpoint quantizes the same
    random base again, so the base checksum agrees, at N = 1 and 2 (the run at N = 2)."""
    ck = os.path.join(TMP, "seeded_ck")
    path = config("seeded.n2", "nf4", True, steps=2, extra={"checkpoint": {"dir": ck, "every": 2}})
    cfg = json.load(open(path))
    cfg["model"] = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "ffn_dim": 256,
                    "n_positions": T, "vocab_size": V, "init_seed": 11}
    json.dump(cfg, open(path, "w"))
    if train("seeded.n2", path, 2)[1] is not None:
        check_eval_any_n("seeded", ck)


QDIR_KEYS = ["", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4"]


def check_quantized_dir():
    """A directory transformers saved from the 4-bit model: read dequantized, transformers' loss."""
    from safetensors.torch import load_file, save_file
    model = reference("nf4", True)
    qdir = os.path.join(TMP, "qdir")
    model.save_pretrained(qdir)
    tensors = load_file(os.path.join(qdir, "model.safetensors"))
    w = "model.layers.1.mlp.down_proj.weight"
    check("qdir.names", all(w + k in tensors for k in QDIR_KEYS),
          f"{sorted(k for k in tensors if k.startswith(w))}")
    with torch.no_grad():
        want_loss = loss_of(model).item()
    for ranks in (1, 2):
        name = f"qdir.n{ranks}"
        path = config(name, "nf4", True, base=qdir)
        cfg = json.load(open(path))
        del cfg["quantization"]  # taken from the directory's config.json
        cfg["lora"]["init"] = "default"  # B = 0: the step's loss is the 4-bit model's
        json.dump(cfg, open(path, "w"))
        dump, _ = train(name, path, ranks)
        if dump is None:
            continue
        ref = read_dump(os.path.join(TMP, "nf4_dq.n1.dump"))
        linear = [k for k in ref if k.startswith("model.layers.") and k.endswith("_proj.weight")]
        check(f"{name}.weights", linear and all(np.array_equal(dump[k], ref[k]) for k in linear),
              "the directory's dequantized weights differ from those quantized from the fp32 directory")
        e = rel(dump["loss"], np.array([want_loss]))
        check(f"{name}.loss", e <= TOL, f"{dump['loss']} vs transformers {want_loss}: rel {e:.3e}")
    check_quant_storage(want_loss)
    # a quant state that does not match its weight's shape
    bad = os.path.join(TMP, "qdir_bad")
    shutil.copytree(qdir, bad)
    state = w + ".quant_state.bitsandbytes__nf4"
    js = json.loads(bytes(tensors[state].numpy()).decode())
    js["shape"] = [js["shape"][1], js["shape"][0]]
    tensors[state] = torch.frombuffer(bytearray(json.dumps(js).encode()), dtype=torch.uint8)
    save_file(tensors, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
    refuse("qdir.shape_mismatch", config("qdir_bad", "nf4", True, base=bad), ["quant state", "does not match"])
    # other quantized formats: one line naming the method
    for method in ("gptq", "awq", "gguf"):
        other = os.path.join(TMP, "qdir_" + method)
        shutil.copytree(BASE, other)
        conf = json.load(open(os.path.join(other, "config.json")))
        conf["quantization_config"] = {"quant_method": method, "bits": 4}
        json.dump(conf, open(os.path.join(other, "config.json"), "w"))
        refuse(f"qdir.{method}", config("qdir_" + method, "nf4", True, base=other), ["quant_method", method])


def check_quant_storage(want_loss):
    """bnb_4bit_quant_storage bfloat16 and float32 (FSDP's setting): the packed codes saved as a BF16 / F32 tensor
    of the same bytes; shardlm reads them as bytes, the weights and loss of the uint8 directory."""
    from safetensors import safe_open
    ref = read_dump(os.path.join(TMP, "nf4_dq.n1.dump"))
    linear = [k for k in ref if k.startswith("model.layers.") and k.endswith("_proj.weight")]
    for storage, st_dtype in ((torch.bfloat16, "BF16"), (torch.float32, "F32")):
        name = f"qdir_{st_dtype.lower()}.n2"
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32, bnb_4bit_quant_storage=storage)
        model = LlamaForCausalLM.from_pretrained(BASE, quantization_config=q, dtype=torch.float32, device_map="cpu",
                                                 use_kernels=False)
        qdir = os.path.join(TMP, "qdir_" + st_dtype.lower())
        model.save_pretrained(qdir)
        with safe_open(os.path.join(qdir, "model.safetensors"), "pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys() if k.endswith("_proj.weight")}
        check(f"{name}.container", dtypes == {st_dtype}, f"the packed weights are {dtypes}, not {st_dtype}")
        with torch.no_grad():
            loss = loss_of(model).item()
        path = config(name, "nf4", True, base=qdir)
        cfg = json.load(open(path))
        del cfg["quantization"]
        cfg["lora"]["init"] = "default"
        json.dump(cfg, open(path, "w"))
        dump, _ = train(name, path, 2)
        if dump is None:
            continue
        check(f"{name}.weights", linear and all(np.array_equal(dump[k], ref[k]) for k in linear),
              "the weights differ from those of the fp32 directory quantized")
        e, e_uint8 = rel(dump["loss"], np.array([loss])), rel(dump["loss"], np.array([want_loss]))
        check(f"{name}.loss", e <= TOL and e_uint8 <= TOL,
              f"{dump['loss']} vs transformers {loss} (uint8 storage {want_loss}): rel {e:.3e}")


def inspect_checksum(ck):
    r = subprocess.run([BIN, "inspect", ck], env=ENV, capture_output=True, text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("LoRA:")), "")
    return line[line.find("checksum"):].split(",")[0] if "checksum" in line else None


def check_export():
    """PEFT's adapters onto the bitsandbytes base, --merge onto the dequantized base, the base's checksum."""
    from peft import PeftModel
    sums = {}
    for ranks in (1, 2):
        ck = os.path.join(TMP, f"export_ck{ranks}")
        name = f"export.n{ranks}"
        path = config(name, "nf4", True, extra={"checkpoint": {"dir": ck, "export_hf": True}})
        cfg = json.load(open(path))
        cfg["optimizer"]["params"]["lr"] = 0.0  # the exported adapters are the dumped ones
        json.dump(cfg, open(path, "w"))
        dump, _ = train(name, path, ranks)
        if dump is None:
            return
        sums[ranks] = inspect_checksum(ck)
    check("export.checksum_world_size", sums[1] and sums[1] == sums[2], f"{sums}")
    base = reference("nf4", True)
    pm = PeftModel.from_pretrained(base, os.path.join(ck, "hf"))
    x = torch.from_numpy(dump["inputs"].astype(np.int64))
    with torch.no_grad():
        peft_logits = pm(input_ids=x).logits.numpy()
    e = rel(dump["logits"][..., :V], peft_logits)
    check("export.peft_on_bnb_base", e <= TOL, f"logits rel {e:.3e}")
    merged = os.path.join(TMP, "merged")
    r = subprocess.run(["mpirun", "-q", "-np", "2", BIN, "export", "--merge", ck, merged], env=ENV,
                       capture_output=True, text=True, timeout=300)
    check("export.merge_run", r.returncode == 0, r.stderr[-600:])
    if r.returncode != 0:
        return
    m = LlamaForCausalLM.from_pretrained(merged, dtype=torch.float32)
    # PEFT's merge of a 4-bit layer: dequantize_4bit(W) + scale B A (then it quantizes again; the bf16/fp32
    # directory keeps the sum)
    worst, bad = 0.0, []
    for layer in range(HF.num_hidden_layers):
        for lin in LINEARS:
            part = "self_attn" if lin in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            w = getattr(getattr(base.model.layers[layer], part), lin).weight
            key = f"model.layers.{layer}.{part}.{lin}"
            want = bnbf.dequantize_4bit(w, w.quant_state).float() + (ALPHA / R) * (
                torch.from_numpy(dump[key + ".lora_B.weight"]) @ torch.from_numpy(dump[key + ".lora_A.weight"]))
            got = getattr(getattr(m.model.layers[layer], part), lin).weight.detach()
            e = rel(got.numpy(), want.numpy())
            worst = max(worst, e)
            if not e <= 1e-6:
                bad.append(f"{key} {e:.2e}")
    check("export.merge_weights", not bad, f"{bad[:3]}")
    with torch.no_grad():
        e = rel(m(input_ids=x).logits.numpy(), peft_logits)
    check("export.merge_logits", e <= TOL, f"rel {e:.3e}")
    print(f"# export: PEFT on the 4-bit base, merged weights within {worst:.1e} of dequantize_4bit + B A", flush=True)


def refuse(name, path, words):
    r = subprocess.run([BIN, "train", path, "--quiet"], env=ENV, capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if "error" in line]
    check(name, r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
          f"rc {r.returncode}: {r.stderr.strip()[-400:]!r}")
    print(f"# {name}: {lines[0] if lines else ''}", flush=True)


def main():
    ref_loss = None
    for ranks in (1, 2, 3):
        loss = check_case(f"nf4_dq.n{ranks}", "nf4", True, ranks)
        ref_loss = ref_loss if ref_loss is not None else loss
    check_case("fp4.n2", "fp4", False, 2)
    for ranks in (2, 3):
        check_storage(ranks)
    check_loading_memory()
    if ref_loss is not None:
        check_sensitivity(ref_loss)
        check_bf16_offload(ref_loss)
    check_resume()
    check_seeded_eval()
    check_quantized_dir()
    check_export()
    check_dpo()
    shutil.rmtree(BASE, ignore_errors=True)
    return 1 if failures() else 0


sys.exit(main())
