#!/usr/bin/env python3
"""lora — LoRA fine-tuning (issue 19): shardlm's LoRA step against its own
full fine-tune step and against PEFT's LoRA over transformers'
LlamaForCausalLM, in one run.

Driven by tools/bench/lora.sh (which builds bin/shardlm and the sgemm probe
first). On train_llama.py's 12-layer Llama shape (12 layers, C 768, 12 heads /
4 KV heads, FFN 2048, vocab 32000, T 512, micro-batch 8, fp32, untied head),
with one environment for all three runs (OMP_NUM_THREADS =
OPENBLAS_NUM_THREADS = --threads, OMP_WAIT_POLICY=passive, OPENBLAS_CORETYPE
from --coretype as tools/bench/coretype.py resolves it):

  * full   bin/shardlm train, every parameter trained: train_llama.py's run
           (CPU backend, 1 rank, ZeRO stage 0, AdamW, clipping 1.0);
  * LoRA   the same run with "lora": {"r": 16, "alpha": 32, "target_modules":
           the seven linear layers of each block, "dropout": 0}: adapters on
           the frozen base, which has no gradients, master weights or Adam
           state, and whose weight gradients are never computed;
  * PEFT   tools/bench/torch_gpt2.py --arch llama --lora 16 --lora-alpha 32
           under build/ref-venv/bin/python: PEFT 0.10.0's get_peft_model over
           transformers 4.40.2's LlamaForCausalLM on Debian's torch 1.13
           (attention "eager"), the same adapters, zero_grad + forward + loss
           + backward + clip_grad_norm_ + AdamW over the adapters only, timed.

The first --warmup steps of each run are dropped; figures are the median
(best) step, tokens/s = B*T over it. Model FLOPs per token: the full step's
from `shardlm plan --json` (6 N_matmul + 12 L C T); a LoRA step's 4 per frozen
matmul parameter (forward and input gradient, no weight gradient), 6 per
adapter parameter, attention as in the full step. Their quotient is the LoRA /
full step ratio that the FLOPs alone give: the bench prints it beside the
measured one. MFU is against the sgemm peak measured before and after the
runs (the higher).

Targets: LoRA step / full step <= 0.7 (shardlm's medians); shardlm LoRA tok/s
/ PEFT LoRA tok/s >= 1.5. The measuring machinery (runs, quiet waits,
contention, statistics) is tools/bench/train_throughput.py's.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import train_llama
import train_throughput as tt

# PEFT's names of the Llama block's linear layers: "all-linear" for this model (the head is not adapted).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STEP_RATIO_TARGET = 0.7  # shardlm LoRA step / shardlm full step, at most
PEFT_RATIO_TARGET = 1.5  # shardlm LoRA tok/s / PEFT LoRA tok/s, at least


def adapter_params(model, r, targets):
    """lora_A (r x in) and lora_B (out x r) of each adapted layer of each block."""
    C, F = model["n_embd"], model["ffn_dim"]
    kv = C // model["n_head"] * model["n_kv_head"]
    io = {"q_proj": C + C, "k_proj": C + kv, "v_proj": C + kv, "o_proj": C + C,
          "gate_proj": C + F, "up_proj": C + F, "down_proj": F + C}
    return model["n_layer"] * r * sum(io[t] for t in targets)


def lora_flops_per_token(full, model, seq_len, adapters):
    """FULL (6 N_matmul + 12 L C T) with 4 flops per frozen matmul parameter instead of 6, plus 6 per adapter."""
    attn = 12.0 * model["n_layer"] * model["n_embd"] * seq_len
    return attn + (full - attn) * 4.0 / 6.0 + 6.0 * adapters


def shardlm_adapter_params(cfg_path):
    """The adapter parameters `shardlm plan` counts for the LoRA config."""
    out = subprocess.run([tt.SHARDLM, "plan", cfg_path, "--target", "cpu"], capture_output=True, text=True).stdout
    m = re.search(r"^LoRA: .* (\d+) adapter parameters", out, re.M)
    return int(m.group(1)) if m else None


def lora_bench_args(description, default_json):
    """The options of a LoRA step-time bench (this one, tools/bench/dpo.py): the common ones, the shape, r, alpha."""
    ap = argparse.ArgumentParser(description=description)
    tt.add_common_args(ap, default_json, train_llama.SHAPES["12L"][-1])
    ap.set_defaults(budget=300.0)
    ap.add_argument("--shape", default="12L", choices=sorted(train_llama.SHAPES),
                    help="train_llama.py's shape (default 12L; small for a quick check of the bench)")
    ap.add_argument("--r", type=int, default=16, help="LoRA rank (default 16)")
    ap.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (default 32)")
    return ap


def main():
    ap = lora_bench_args("shardlm LoRA vs shardlm full fine-tune vs PEFT LoRA, step time", "lora.json")
    ap.add_argument("--hf-attn", default="auto", choices=("auto", "eager", "sdpa"),
                    help="transformers' attn_implementation (auto: its default, eager on torch < 2.1.1)")
    ap.add_argument("--hf-python", default=train_llama.HF_PYTHON,
                    help="interpreter with transformers and peft (default build/ref-venv/bin/python)")
    args = ap.parse_args()

    os.makedirs(tt.OUT, exist_ok=True)
    env, coretype_env, cpu = tt.bench_env(args)
    if not os.access(args.hf_python, os.X_OK):
        raise SystemExit(f"error: {args.hf_python} missing: PEFT runs there; make it with: bash tools/deps.sh "
                         f"--test (or pass --hf-python)")
    if args.check_only:
        return

    L, C, NH, KVH, F, V, T, B, _ = train_llama.SHAPES[args.shape]
    lora = {"r": args.r, "alpha": args.alpha, "target_modules": list(TARGETS), "dropout": 0.0}
    full = train_llama.llama_shape(f"lora_{args.shape}_full", L, C, NH, KVH, F, V, T, B, args.steps, args.hf_attn)
    adapted = train_llama.llama_shape(f"lora_{args.shape}_r{args.r}", L, C, NH, KVH, F, V, T, B, args.steps,
                                      args.hf_attn)
    adapted.config = {"lora": lora}
    adapted.ref_args += ["--lora", args.r, "--lora-alpha", args.alpha, "--lora-targets", ",".join(TARGETS),
                         "--lora-dropout", 0.0]
    peft = tt.Reference("peft", args.hf_python, label="PEFT")
    label = f"{args.shape} {full.label.split(' ', 1)[1]}"  # train_llama's label, without the run's file name
    n = str(args.threads)
    print(f"cpu: {cpu}; shardlm: {os.path.relpath(tt.SHARDLM, tt.ROOT)}; PEFT: {os.path.relpath(args.hf_python, tt.ROOT)} "
          f"{os.path.relpath(peft.script, tt.ROOT)} --lora {args.r}")
    print(f"env: OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} OMP_WAIT_POLICY=passive "
          f"OPENBLAS_CORETYPE={coretype_env}  (same for shardlm, PEFT and sgemm_peak)")
    print(f"shape: {label}, fp32, untied head; LoRA r {args.r}, alpha {args.alpha:g}, dropout 0, "
          f"{', '.join(TARGETS)}")
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])} on {os.cpu_count()} CPUs")
    for shape in (full, adapted):
        tt.write_config(shape, args.threads)
    adapters = adapter_params(full.model, args.r, TARGETS)
    counted = shardlm_adapter_params(adapted.cfg_path)
    if counted != adapters:
        raise SystemExit(f"error: shardlm plan counts {counted} adapter parameters, this bench {adapters}")
    fpt = {"full": full.flops_per_token,
           "lora": lora_flops_per_token(full.flops_per_token, full.model, T, adapters)}
    fpt["peft"] = fpt["lora"]

    quiet = tt.QuietWaiter(args.wait_quiet, args.wait_quiet_total)
    quiet("sgemm_peak")
    peak0, core, blascfg, sizes = tt.sgemm_peak(env, args.threads)
    print(f"sgemm_peak: {', '.join(f'{s}^3 {g}' for s, g in sizes)} GFLOP/s -> {peak0:.1f}; "
          f"openblas_get_corename() = {core}  [{cpu}]")
    print(f"  {blascfg.strip()}")

    runs = (("full", "shardlm full fine-tune", full, None),
            ("lora", f"shardlm LoRA r{args.r}", adapted, None),
            ("peft", f"PEFT LoRA r{args.r}", adapted, peft))
    best = {}
    for r in range(args.rounds):
        for key, who, shape, ref in runs:
            quiet(who)
            res = tt.measure(args, shape, ref, env, f"r{r}", f"round {r} {who:22s}", core)
            if key not in best or res["median_ms"] < best[key]["median_ms"]:
                best[key] = res
    summary = best["peft"]["summary"]
    if summary.get("trainable_params") != adapters:
        print(f"warning: PEFT trains {summary.get('trainable_params')} parameters, shardlm {adapters}")

    quiet("sgemm_peak")
    peak1, _, _, sizes1 = tt.sgemm_peak(env, args.threads)
    peak = max(peak0, peak1)
    print(f"sgemm_peak again after the runs: {peak1:.1f} GFLOP/s; MFU uses the higher, {peak:.1f}  [{cpu}]")

    tok = B * T
    figures = {}
    for key, who, _, _ in runs:
        res = best[key]
        figures[key] = {"name": who, "median_ms": res["median_ms"], "best_ms": res["best_ms"], "steps": res["n"],
                        "tok_s": tok / res["median_ms"] * 1e3, "best_tok_s": tok / res["best_ms"] * 1e3,
                        "flops_per_token": fpt[key], "mfu": tok / res["median_ms"] * 1e3 * fpt[key] / (peak * 1e9),
                        "other": res["other"], "cpu_util": res["cpu_util"], "ms": res["ms"], "log": res["log"]}
    fl, lo, pe = figures["full"], figures["lora"], figures["peft"]
    step_ratio, step_ratio_best = lo["median_ms"] / fl["median_ms"], lo["best_ms"] / fl["best_ms"]
    flop_ratio = fpt["lora"] / fpt["full"]
    peft_ratio, peft_ratio_best = lo["tok_s"] / pe["tok_s"], lo["best_tok_s"] / pe["best_tok_s"]

    print()
    print(f"{cpu}: threads {n}, OPENBLAS_CORETYPE={coretype_env}, OpenBLAS kernel {core}; {label}; "
          f"median (best) over the steps after {args.warmup} warm-up")
    hdr = f"{'run':<26} {'step ms':>20} {'tok/s':>16} {'GFLOP/token':>11} {'MFU':>6} {'other procs':>11}"
    print(hdr)
    print("-" * len(hdr))
    for key, who, _, _ in runs:
        g = figures[key]
        print(f"{who:<26} {g['median_ms']:>9.1f} ({g['best_ms']:>8.1f}) {g['tok_s']:>7.1f} ({g['best_tok_s']:>6.1f}) "
              f"{g['flops_per_token'] / 1e9:>11.3f} {100 * g['mfu']:>5.1f}% {100 * g['other']:>10.0f}%")
    print()
    print(f"LoRA step / full step (shardlm): {step_ratio:.3f} (best steps {step_ratio_best:.3f}); the model FLOPs "
          f"alone give {flop_ratio:.3f}  [{cpu}]")
    print(f"shardlm LoRA / PEFT LoRA tok/s: {peft_ratio:.2f}x (best steps {peft_ratio_best:.2f}x)  [{cpu}]")
    print(f"PEFT: peft {summary.get('peft', '?')}, transformers {summary.get('transformers', '?')}, "
          f"torch {summary['torch']}, attn_implementation {summary.get('attn', '?')}, "
          f"{summary.get('trainable_params')} trainable parameters")
    if min(peak0, peak1) < 0.85 * peak:
        print(f"note: sgemm peak moved from {peak0:.1f} to {peak1:.1f} GFLOP/s during the run: the machine's speed "
              f"varied (shared host or other processes); compare ratios from a quiet run")
    contended = [g["name"] for g in figures.values() if g["other"] > 0.10]
    if contended:
        print(f"note: other processes used >10% of the CPUs during {', '.join(contended)}; numbers are contended")
    print(f"target LoRA step <= {STEP_RATIO_TARGET} x full step: "
          f"{'met' if step_ratio <= STEP_RATIO_TARGET else 'NOT met'} ({step_ratio:.3f})")
    print(f"target shardlm LoRA >= {PEFT_RATIO_TARGET}x PEFT tok/s: "
          f"{'met' if peft_ratio >= PEFT_RATIO_TARGET else 'NOT met'} ({peft_ratio:.2f}x)")
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "isa": args.isa, "threads": args.threads, "coretype_env": coretype_env,
                      "corename": core, "shape": label, "model": full.model, "seq_len": T, "batch": B,
                      "tokens_per_step": tok, "lora": lora, "adapter_params": adapters,
                      "peft": {k: summary.get(k) for k in ("peft", "transformers", "torch", "attn",
                                                           "trainable_params", "corename")},
                      "sgemm_peak_gflops": peak, "sgemm_sizes": sizes + sizes1, "runs": figures,
                      "step_ratio": step_ratio, "step_ratio_best": step_ratio_best, "flop_ratio": flop_ratio,
                      "peft_ratio": peft_ratio, "peft_ratio_best": peft_ratio_best,
                      "targets": {"step_ratio_max": STEP_RATIO_TARGET, "peft_ratio_min": PEFT_RATIO_TARGET}},
                     f, indent=1)
    print(f"results: {os.path.relpath(args.json, tt.ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
