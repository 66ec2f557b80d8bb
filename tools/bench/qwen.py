#!/usr/bin/env python3
"""qwen — the Qwen families on the CPU: shardlm's LoRA step on a Qwen3 shape
against PEFT 0.21 over transformers 5.25, and shardlm generate on a Qwen2.5
shape against transformers 5.25's generate() at batch 1 and 8, in one run.

Driven by tools/bench/qwen.sh (which builds bin/shardlm). The reference is
build/ref5-venv (transformers 5.25, PEFT 0.21 over PyPI's torch 2.11 on the
CPU; bash tools/deps.sh --test makes it), run with its library path
(tools/toolenv.py ref5_env). Both models are written once by transformers'
save_pretrained into build/bench/ (fp32, random weights, vocabulary 32000):

  qwen3   Qwen3ForCausalLM: 6 layers, hidden 512, 8 heads / 4 key-value
          heads, head_dim 64, q/k RMSNorm, FFN 1536, untied head
  qwen25  Qwen2ForCausalLM: 6 layers, hidden 512, 8 heads / 2 key-value
          heads, q/k/v biases, rope_theta 1e6, FFN 1536, tied embeddings

LoRA step: r 16, alpha 32, dropout 0 on every linear layer of the blocks
(q k v o gate up down), AdamW over the adapters (lr 1e-4), clipping 1.0,
micro-batch 4 of T 256 (random token windows, fp32). shardlm: bin/shardlm
train from the directory (1 rank, ZeRO stage 0; its metrics' per-step ms).
PEFT: get_peft_model over Qwen3ForCausalLM (transformers 5's default
attention, SDPA), zero_grad + forward + loss + backward + clip_grad_norm_ +
AdamW step timed. The first --warmup steps are dropped; the median of the
rest counts. Ratio: PEFT's step / shardlm's (> 1: shardlm faster).

generate: prompts of 64 random ids ({"ids"} prompt file, no tokenizer), 128
new tokens, greedy, end of sequence ignored, batch 1 and 8; seconds from the
first forward to the last token (loading excluded on both sides: shardlm's
own "generate: N new tokens in S s" line), best of --repeats. Ratio: shardlm
tok/s / transformers tok/s. Row 0's tokens are compared too.

The same threads and OPENBLAS_CORETYPE for both sides (train_throughput.py's
bench_env); the CPU is named beside the figures. Output: build/bench/qwen.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import generate
import train_throughput as tt

sys.path.insert(0, os.path.join(tt.ROOT, "tools"))
from datafiles import write_shard  # noqa: E402
from toolenv import REF5_VENV, ref5_env  # noqa: E402

HF_PYTHON = os.path.join(REF5_VENV, "bin", "python")
V, T, B, R, ALPHA, LR = 32000, 256, 4, 16, 32, 1e-4
COMMON = dict(vocab_size=V, hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
              max_position_embeddings=512, initializer_range=0.02, bos_token_id=None, eos_token_id=None)
SHAPES = {"qwen3": dict(COMMON, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False),
          "qwen25": dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True)}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ---- transformers' side (runs under build/ref5-venv) -------------------------------------------
def model_class(kind):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    return (Qwen3Config, Qwen3ForCausalLM) if kind == "qwen3" else (Qwen2Config, Qwen2ForCausalLM)


def hf_make(kind, out):
    import torch
    torch.manual_seed(0)
    config_class, model_class_ = model_class(kind)
    config = config_class(**SHAPES[kind], rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    model_class_(config).float().save_pretrained(out)


def hf_lora(args):
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    torch.set_num_threads(args.threads)
    base = model_class("qwen3")[1].from_pretrained(args.model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    tokens = np.fromfile(args.data, dtype="<u2", offset=1024).astype(np.int64)
    ms = []
    for s in range(args.steps):
        x = torch.from_numpy(tokens[s * B * T:(s + 1) * B * T].reshape(B, T))
        y = torch.from_numpy(tokens[s * B * T + 1:(s + 1) * B * T + 1].reshape(B, T))
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ms.append(1e3 * (time.perf_counter() - t0))
    print(json.dumps({"ms": ms}))


def hf_generate(args):
    import torch
    torch.set_num_threads(args.threads)
    model = model_class("qwen25")[1].from_pretrained(args.model, dtype=torch.float32).eval()
    print(json.dumps(generate.timed_generate(model, args)))


# ---- shardlm's side and the driver ---------------------------------------------------------------
def hf_run(env, *argv):
    r = subprocess.run([HF_PYTHON, __file__, "--hf-side", *argv], env=ref5_env(env), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"transformers side failed ({' '.join(argv[:2])}): {r.stderr[-800:]}")
    return json.loads(r.stdout.splitlines()[-1]) if r.stdout.strip() else None


def shardlm_lora(args, env, model, data):
    metrics = os.path.join(tt.OUT, "qwen_lora_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cfg = {"model": {"from_pretrained": model}, "data": {"train": data, "seq_len": T, "shuffle": False},
           "train": {"steps": args.steps, "eval_every": 0, "sample_tokens": 0, "metrics": metrics,
                     "threads": args.threads},
           "train_micro_batch_size_per_gpu": B, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 0},
           "lora": {"r": R, "alpha": ALPHA, "dropout": 0.0, "target_modules": TARGETS}}
    path = os.path.join(tt.OUT, "qwen_lora.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([tt.SHARDLM, "train", path, "--quiet"], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"shardlm train failed: {r.stderr[-800:]}")
    return [json.loads(x)["ms"] for x in open(metrics) if '"ms"' in x]


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description="Qwen3 LoRA step and Qwen2.5 generate: shardlm vs transformers 5.25")
    generate.add_generate_args(ap, 128, 64, "qwen.json")
    ap.add_argument("--steps", type=int, default=8, help="LoRA steps per side (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps not counted (default 2)")
    ap.add_argument("--hf-side", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_side:
        what = args.hf_side[0]
        return (hf_make(args.hf_side[1], args.model) if what == "make" else hf_lora(args) if what == "lora"
                else hf_generate(args))
    setup = generate.bench_setup(args, HF_PYTHON)
    if setup is None:
        return
    env, coretype_env, cpu = setup
    models = {k: os.path.join(tt.OUT, f"qwen_{k}") for k in SHAPES}
    for kind, d in models.items():
        if not os.path.exists(os.path.join(d, "config.json")):
            hf_run(env, "make", kind, "--model", d)
    import random
    rng = random.Random(48)
    data = os.path.join(tt.OUT, "qwen_tokens.bin")
    write_shard(data, [rng.randrange(V) for _ in range(args.steps * B * T + 1)])
    th = ["--threads", str(args.threads)]
    print(f"cpu: {cpu}; threads {args.threads}; OPENBLAS_CORETYPE={coretype_env}; transformers 5.25 + PEFT 0.21 on "
          f"torch 2.11 ({os.path.relpath(HF_PYTHON, tt.ROOT)})\nload average before: {load()} on {os.cpu_count()} "
          "CPUs", flush=True)

    s_ms = shardlm_lora(args, env, models["qwen3"], data)[args.warmup:]
    p_ms = hf_run(env, "lora", "--model", models["qwen3"], "--data", data, "--steps", str(args.steps), *th)["ms"]
    p_ms = p_ms[args.warmup:]
    lora = {"shardlm_ms": statistics.median(s_ms), "peft_ms": statistics.median(p_ms), "steps": len(s_ms)}
    lora["ratio"] = lora["peft_ms"] / lora["shardlm_ms"]
    print(f"\nQwen3 LoRA step (6 L, C 512, 8/4 heads, head_dim 64, FFN 1536, V {V}; B {B} x T {T}; r {R} on 7 "
          f"linears): median over {len(s_ms)} steps after {args.warmup}")
    print(f"  shardlm {lora['shardlm_ms']:.0f} ms ({B * T / lora['shardlm_ms'] * 1e3:.0f} tok/s), "
          f"PEFT {lora['peft_ms']:.0f} ms ({B * T / lora['peft_ms'] * 1e3:.0f} tok/s): "
          f"shardlm {lora['ratio']:.2f}x PEFT  [{cpu}]", flush=True)

    batches = [int(b) for b in args.batches.split(",")]
    prompts = [[rng.randrange(V) for _ in range(args.prompt_len)] for _ in range(max(batches))]
    gen = {}
    print(f"\nQwen2.5-shaped generate (6 L, C 512, 8/2 heads, biases, tied; prompt {args.prompt_len}, "
          f"{args.new} new, greedy)\n{'batch':>5} {'shardlm tok/s':>14} {'transformers tok/s':>19} {'ratio':>7}  "
          "same tokens (row 0)")
    for b in batches:
        sub = os.path.join(tt.OUT, f"qwen_prompts_b{b}.jsonl")
        with open(sub, "w") as f:
            f.writelines(json.dumps({"ids": p}) + "\n" for p in prompts[:b])
        s_secs, s_ids = generate.shardlm_side(args, env, models["qwen25"], sub, b)
        hf = hf_run(env, "generate", "--model", models["qwen25"], "--prompts", sub, "--batch", str(b), "--new",
                    str(args.new), "--repeats", str(args.repeats), *th)
        s_tps, h_tps = b * args.new / s_secs, b * args.new / hf["seconds"]
        gen[b] = {"shardlm_s": s_secs, "hf_s": hf["seconds"], "shardlm_tok_s": s_tps, "hf_tok_s": h_tps,
                  "ratio": s_tps / h_tps, "same_tokens_row0": s_ids == hf["ids"]}
        print(f"{b:>5} {s_tps:>14.1f} {h_tps:>19.1f} {s_tps / h_tps:>6.2f}x  {s_ids == hf['ids']}  [{cpu}]",
              flush=True)
    print(f"load average after: {load()}")
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "threads": args.threads, "coretype_env": coretype_env, "shapes": SHAPES,
                   "lora": lora, "generate": gen, "prompt_len": args.prompt_len, "new": args.new}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
