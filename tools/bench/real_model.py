#!/usr/bin/env python3
"""real_model — shardlm on the real SmolLM2-135M-Instruct (issue 33) against
transformers and PEFT, in one run, same threads and OpenBLAS core type:

  generate  greedy decoding of --new tokens per prompt (end-of-sequence
            ignored, so every prompt makes all of them), chat prompts through
            the template, batch 1 and batch 8: shardlm generate (1 rank, its
            KV cache) against transformers' model.generate (do_sample=False,
            use_cache, left-padded batch); new tokens / wall seconds of the
            generation (shardlm: its own log line, model load excluded;
            transformers: the generate call).
  lora      one LoRA step (r 16, alpha 32, all seven linear layers of each
            block, AdamW over the adapters, micro-batch 4 of the real chat
            samples padded to T): shardlm train (1 rank, ZeRO 0) against
            PEFT 0.10.0's get_peft_model over LlamaForCausalLM (zero_grad,
            forward, loss, backward, clip, step); median of the steps after
            the first --warmup.

    bash tools/bench/real_model.sh [--threads N] [--new N] [--steps N] [--warmup N]

Prints each figure and the ratios (shardlm / reference), with the CPU model.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import coretype  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Give me three tips for staying healthy.",
             "Write a haiku about the sea.", "Explain what a GPU is in one paragraph.",
             "How do I reverse a list in Python?", "Name three famous painters.",
             "What is photosynthesis?", "Summarize the plot of Romeo and Juliet."]


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def shardlm_generate(model, n_prompts, new, env, tmp):
    path = os.path.join(tmp, f"prompts{n_prompts}.jsonl")
    with open(path, "w") as f:
        for q in QUESTIONS[:n_prompts]:
            f.write(json.dumps({"prompt": q}) + "\n")
    r = subprocess.run([os.path.join(ROOT, "bin", "shardlm"), "generate", model, "--prompt-file", path,
                        "--max-new-tokens", str(new), "--batch", str(n_prompts), "--ignore-eos"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"shardlm generate failed: {r.stderr[-600:]}")
    m = re.search(r"generate: (\d+) new tokens in ([0-9.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2))


def hf_generate(hf, tok, n_prompts, new):
    import torch
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS[:n_prompts]]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          pad_token_id=tok.pad_token_id)
    dt = time.perf_counter() - t0
    return (out.shape[1] - enc["input_ids"].shape[1]) * n_prompts / dt


def sample_file(model, tmp):
    src = os.path.join(tmp, "pairs.jsonl")
    with open(src, "w") as f:
        for i, q in enumerate(QUESTIONS * 2):
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": f"Answer {i}: " + q * 2}]}) + "\n")
    out = os.path.join(tmp, "pairs.h5")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", model, "-o",
                    out, src], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def shardlm_lora(model, data, T, steps, warmup, env, tmp):
    metrics = os.path.join(tmp, "lora.jsonl")
    cfg = {"model": {"from_pretrained": model},
           "data": {"train": data, "max_seq_length": T, "pad_to_multiple_of": T, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "metrics": metrics},
           "train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
           "lora": {"r": 16, "alpha": 32, "target_modules": "all-linear"}}
    path = os.path.join(tmp, "lora.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([os.path.join(ROOT, "bin", "shardlm"), "train", path], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"shardlm train failed: {r.stderr[-600:]}")
    ms = [json.loads(x)["ms"] for x in open(metrics) if '"ms"' in x]
    return statistics.median(ms[warmup:])


def peft_lora(model, T, steps, warmup):
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    base = transformers.LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32,
                                                         attn_implementation="eager")
    m = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, 49152, (4, T))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.requires_grad], 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    core = coretype.resolve("auto")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(a.threads)
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    model = subprocess.run(["bash", os.path.join(ROOT, "tools", "real_model.sh")], check=True,
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    env = dict(os.environ)
    print(f"CPU: {cpu_name()}; {a.threads} threads; OPENBLAS_CORETYPE {core or 'unset'}; SmolLM2-135M-Instruct fp32")
    tok = transformers.AutoTokenizer.from_pretrained(model)
    hf = transformers.LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory(prefix="shardlm-bench-real.") as tmp:
        for n in (1, 8):
            s = shardlm_generate(model, n, a.new, env, tmp)
            h = hf_generate(hf, tok, n, a.new)
            print(f"generate batch {n}: shardlm {s:.1f} tokens/s, transformers {h:.1f} tokens/s, ratio {s / h:.2f}")
        data = sample_file(model, tmp)
        s = shardlm_lora(model, data, a.seq, a.steps, a.warmup, env, tmp)
        p = peft_lora(model, a.seq, a.steps, a.warmup)
        tok_s = 4 * a.seq
        print(f"LoRA step (4 x {a.seq} tokens): shardlm {s:.0f} ms ({tok_s / s * 1000:.0f} tokens/s), "
              f"PEFT {p:.0f} ms ({tok_s / p * 1000:.0f} tokens/s), speed ratio {p / s:.2f}")


if __name__ == "__main__":
    main()
