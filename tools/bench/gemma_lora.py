#!/usr/bin/env python3
"""gemma_lora — the Gemma 3 LoRA step on the CPU (issue 49): shardlm's against
PEFT 0.21's over transformers 5.25's Gemma3ForCausalLM, in one run, with the
CPU named beside the figures.

    bash tools/bench/gemma_lora.sh [--threads N] [--steps N] [--layers L] [--vocab V] [--seq T]

Shape: Gemma 3 270M's (hidden 640, 4 heads of head_dim 256, 1 key/value head,
FFN 2048, q/k norms, 5 local : 1 global layers with rope bases 1e4 and 1e6,
tied embedding) at --layers layers (6) and --vocab tokens (262144, Gemma 3's
256k vocabulary: the LM head is most of the step), micro-batch 1 x --seq
tokens (256), fp32, sliding_window 512 >= the sequence. LoRA r 16, alpha 32,
dropout 0 on the seven linear layers of every block; AdamW over the adapters,
clipping at 1.0. Both sides run with the same threads (OMP_NUM_THREADS =
OPENBLAS_NUM_THREADS = torch's = --threads). The first 2 steps are dropped;
the figures are the median and best step (ms) and tokens/s, and their ratio.
The model is written once by transformers' save_pretrained (random weights);
shardlm reads that directory. Outputs: build/bench/gemma_lora/.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("gemma_lora")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WARMUP = 2


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def make_model(d, a):
    if os.path.exists(os.path.join(d, "config.json")):
        return
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=a.vocab, hidden_size=640, intermediate_size=2048, num_hidden_layers=a.layers,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                           max_position_embeddings=4096, sliding_window=512, pad_token_id=None)
    Gemma3ForCausalLM(cfg).save_pretrained(d)


def shardlm_steps(d, a, out):
    data = os.path.join(out, "tokens.bin")
    tokens = torch.randint(0, a.vocab, (a.seq * (a.steps + 1) + 1,), generator=torch.Generator().manual_seed(1))
    header = [20240520, 2, len(tokens)] + [0] * 253
    with open(data, "wb") as f:
        f.write(torch.tensor(header, dtype=torch.int32).numpy().tobytes())
        f.write(tokens.to(torch.int32).numpy().tobytes())
    metrics = os.path.join(out, "shardlm.jsonl")
    cfg = {"model": {"from_pretrained": d}, "data": {"train": data, "seq_len": a.seq, "shuffle": False},
           "train": {"steps": a.steps, "eval_every": 0, "sample_tokens": 0, "metrics": metrics},
           "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": TARGETS}}
    path = os.path.join(out, "shardlm.json")
    json.dump(cfg, open(path, "w"))
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads),
               OMP_WAIT_POLICY="passive")
    r = subprocess.run([os.path.join(ROOT, "bin", "shardlm"), "train", path], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gemma_lora: shardlm failed: {r.stderr[-500:]}")
    rows = [json.loads(line) for line in open(metrics) if '"ms"' in line]
    return [row["ms"] for row in rows][WARMUP:]


def peft_steps(d, a):
    torch.set_num_threads(a.threads)
    model = Gemma3ForCausalLM.from_pretrained(d, dtype=torch.float32)  # transformers 5.25's default attention (SDPA)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(2)
    ms = []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (1, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(input_ids=x[:, :-1]).logits[0], x[0, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms[WARMUP:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    out = os.path.join(ROOT, "build", "bench", "gemma_lora")
    os.makedirs(out, exist_ok=True)
    d = os.path.join(out, f"gemma3_{a.layers}L_{a.vocab}")
    make_model(d, a)
    ours = shardlm_steps(d, a, out)
    theirs = peft_steps(d, a)
    print(f"CPU: {cpu_name()}, {a.threads} threads; Gemma 3 270M's shape at {a.layers} layers, vocabulary {a.vocab}, "
          f"1 x {a.seq} tokens, fp32, LoRA r 16 on {len(TARGETS)} linear layers, {len(ours)} steps timed")
    res = {}
    for name, ms in (("shardlm", ours), ("PEFT 0.21", theirs)):
        med = statistics.median(ms)
        res[name] = med
        print(f"  {name:10s} step median {med:9.1f} ms  best {min(ms):9.1f} ms  {a.seq / med * 1e3:8.1f} tokens/s")
    print(f"  shardlm / PEFT tokens/s: {res['PEFT 0.21'] / res['shardlm']:.2f}x")
    json.dump({"cpu": cpu_name(), "threads": a.threads, "shardlm_ms": ours, "peft_ms": theirs},
              open(os.path.join(out, "gemma_lora.json"), "w"))


if __name__ == "__main__":
    main()
