#!/usr/bin/env python3
"""generate — greedy generation speed (issue 20): shardlm generate against
transformers' generate() on the same model, in one run.

Driven by tools/bench/generate.sh (which builds bin/shardlm). The model:
train_llama.sh's 12L Llama shape (12 layers, C 768, 12 heads / 4 KV heads,
FFN 2048, vocabulary 32000, untied head), random weights in fp32, written
once by transformers into build/bench/generate_12L (context 512). Prompts:
128 random token ids each (a {"ids": [...]} prompt file, so no tokenizer is
involved); 256 new tokens, greedy, the end-of-sequence token ignored; batch
1 and 8 (one rank: the batch is --batch). transformers runs
LlamaForCausalLM.generate(do_sample=False, min_new_tokens = max_new_tokens)
under build/ref-venv/bin/python, its KV cache on, attention "eager" (torch
1.13 has no SDPA path in transformers 4.40).

Tokens per second = batch x 256 / the time from the first forward to the
last token (prefill included; loading excluded on both sides), best of
--repeats runs. Target: shardlm >= 2x transformers at both batch sizes. The
same threads and OPENBLAS_CORETYPE for both (train_throughput.py's
bench_env), the CPU named beside every figure. Output also lands in
build/bench/generate.json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import train_throughput as tt

TARGET = 2.0
SHAPE = dict(L=12, C=768, NH=12, KVH=4, F=2048, V=32000, CTX=512)
HF_PYTHON = os.path.join(tt.ROOT, "build", "ref-venv", "bin", "python")


def hf_side(args):
    """Runs in ref-venv: makes the model if missing, or times transformers' generate."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(args.threads)
    if args.make:
        torch.manual_seed(0)
        s = SHAPE
        cfg = LlamaConfig(vocab_size=s["V"], hidden_size=s["C"], intermediate_size=s["F"], num_hidden_layers=s["L"],
                          num_attention_heads=s["NH"], num_key_value_heads=s["KVH"], max_position_embeddings=s["CTX"],
                          tie_word_embeddings=False, initializer_range=0.02, eos_token_id=None, bos_token_id=None)
        LlamaForCausalLM(cfg).float().save_pretrained(args.make, safe_serialization=True)
        return
    model = LlamaForCausalLM.from_pretrained(args.model, attn_implementation="eager").eval()
    print(json.dumps(timed_generate(model, args)))


def timed_generate(model, args):
    """transformers' greedy generate() of args.new tokens from the first args.batch prompts of args.prompts (a
    {"ids"} file), best of args.repeats: {"seconds", "new_tokens", "ids" (row 0's new tokens)}."""
    import torch
    ids = torch.tensor([json.loads(x)["ids"] for x in open(args.prompts)][:args.batch])
    best, out = None, None
    with torch.no_grad():
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                 min_new_tokens=args.new, do_sample=False, pad_token_id=0)
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
    return {"seconds": best, "new_tokens": int(out.shape[0] * (out.shape[1] - ids.shape[1])),
            "ids": out[0, ids.shape[1]:].tolist()}


def shardlm_side(args, env, model, prompts, batch):
    best, ids = None, None
    for _ in range(args.repeats):
        r = subprocess.run([tt.SHARDLM, "generate", model, "--prompt-file", prompts, "--batch", str(batch),
                            "--max-new-tokens", str(args.new), "--ignore-eos", "--json",
                            "--set", f"train.threads={args.threads}"],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"shardlm generate failed: {r.stderr[-800:]}")
        m = re.search(r"generate: (\d+) new tokens in ([0-9.]+) s", r.stderr)
        secs = float(m.group(2))
        best = secs if best is None or secs < best else best
        ids = json.loads(r.stdout.splitlines()[0])["ids"]
    return best, ids


def add_generate_args(ap, new, prompt_len, json_name):
    """The options of a generate bench (this one, tools/bench/qwen.py), with these defaults, and the hidden ones of
    its transformers side (--model, --prompts, --batch)."""
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--coretype", default=None, help="OPENBLAS_CORETYPE for both sides (train_throughput.py)")
    ap.add_argument("--isa", default="native", choices=("native", "avx2"))
    ap.add_argument("--new", type=int, default=new, help=f"new tokens per prompt (default {new})")
    ap.add_argument("--prompt-len", type=int, default=prompt_len)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=2, help="runs per side and batch; the best counts (default 2)")
    ap.add_argument("--json", default=os.path.join(tt.OUT, json_name))
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)


def bench_setup(args, hf_python):
    """train_throughput's environment (threads, core type) for both sides: (env, OPENBLAS_CORETYPE as set, the
    CPU's description), build/bench made; None with --check-only. Ends the program when HF_PYTHON is missing."""
    args.wait_quiet = 0
    env, coretype_env, cpu = tt.bench_env(args)
    if not os.access(hf_python, os.X_OK):
        raise SystemExit(f"error: {hf_python} missing: make it with bash tools/deps.sh --test")
    if args.check_only:
        return None
    os.makedirs(tt.OUT, exist_ok=True)
    return env, coretype_env, cpu


def main():
    ap = argparse.ArgumentParser(description="shardlm generate vs transformers generate, tokens/s")
    add_generate_args(ap, 256, 128, "generate.json")
    ap.add_argument("--hf-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--make", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_side:
        return hf_side(args)
    setup = bench_setup(args, HF_PYTHON)
    if setup is None:
        return
    env, coretype_env, cpu = setup
    model = os.path.join(tt.OUT, "generate_12L")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([HF_PYTHON, __file__, "--hf-side", "--make", model], env=env, check=True)
    import random
    rng = random.Random(1)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = os.path.join(tt.OUT, "generate_prompts.jsonl")
    with open(prompts, "w") as f:
        for _ in range(max(batches)):
            f.write(json.dumps({"ids": [rng.randrange(SHAPE["V"]) for _ in range(args.prompt_len)]}) + "\n")
    print(f"cpu: {cpu}; threads {args.threads}; OPENBLAS_CORETYPE={coretype_env}; model 12L Llama fp32 "
          f"(C 768, 12/4 heads, FFN 2048, V 32000); prompt {args.prompt_len} tokens, {args.new} new, greedy")
    rows, results = [], {}
    for b in batches:
        sub = os.path.join(tt.OUT, f"generate_prompts_b{b}.jsonl")
        with open(prompts) as f, open(sub, "w") as g:
            g.writelines(f.readlines()[:b])
        s_secs, s_ids = shardlm_side(args, env, model, sub, b)
        r = subprocess.run([HF_PYTHON, __file__, "--hf-side", "--model", model, "--prompts", sub, "--batch", str(b),
                            "--new", str(args.new), "--threads", str(args.threads), "--repeats", str(args.repeats)],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"transformers side failed: {r.stderr[-800:]}")
        hf = json.loads(r.stdout.splitlines()[-1])
        s_tps, h_tps = b * args.new / s_secs, b * args.new / hf["seconds"]
        same = s_ids == hf["ids"]
        results[b] = {"shardlm_s": s_secs, "hf_s": hf["seconds"], "shardlm_tok_s": s_tps, "hf_tok_s": h_tps,
                      "ratio": s_tps / h_tps, "same_tokens_row0": same}
        rows.append((b, s_tps, h_tps, s_tps / h_tps, same))
    print(f"\n{'batch':>5} {'shardlm tok/s':>14} {'transformers tok/s':>19} {'ratio':>7}  same greedy tokens (row 0)")
    for b, s, h, ratio, same in rows:
        print(f"{b:>5} {s:>14.1f} {h:>19.1f} {ratio:>6.2f}x  {same}")
    met = all(r[3] >= TARGET for r in rows)
    print(f"target shardlm >= {TARGET}x transformers at every batch: {'met' if met else 'NOT met'}  [{cpu}]")
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "threads": args.threads, "coretype_env": coretype_env, "shape": SHAPE,
                   "prompt_len": args.prompt_len, "new": args.new, "results": results, "target": TARGET}, f,
                  indent=1)


if __name__ == "__main__":
    sys.exit(main())
