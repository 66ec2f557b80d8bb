#!/usr/bin/env bash
# LoRA fine-tuning step time (issue 19): shardlm's LoRA against shardlm's full
# fine-tune and against PEFT's LoRA over transformers' LlamaForCausalLM, in
# one run, with the sgemm peak measured in the same run.
#
#   bash tools/bench/lora.sh [--threads N] [--coretype X] [--isa native|avx2] [--steps N]
#        [--shape 12L|small] [--r R] [--alpha A] [--hf-attn auto|eager|sdpa]
#        [--budget S] [--rounds R] [--wait-quiet S] [--no-build]
#
# Shape: train_llama.sh's 12L (12 layers, C 768, 12 heads / 4 KV heads, FFN
# 2048, vocab 32000, T 512, micro-batch 8, fp32, untied head), 6 steps per run
# of which the first 2 (--warmup) are not counted. Three runs: shardlm full
# fine-tune; shardlm with LoRA r 16, alpha 32, dropout 0 on q_proj k_proj
# v_proj o_proj gate_proj up_proj down_proj; PEFT 0.10.0 with the same LoRA
# (tools/bench/torch_gpt2.py --lora, AdamW and clipping over the adapters).
# Prints median (best) step ms, tokens/s and MFU of each, with the CPU model;
# targets: shardlm LoRA step <= 0.7 x its full step, shardlm LoRA >= 1.5x
# PEFT's tokens/s. About 6 minutes on a quiet 2-core machine (about 11 with
# --rounds 2).
#
# --threads, --coretype, --isa, --budget (here 300 s per run), --rounds,
# --wait-quiet and --no-build are train_throughput.sh's (see there). PEFT runs
# under build/ref-venv/bin/python (peft 0.10.0, transformers 4.40.2 over
# Debian's torch 1.13; make it with `bash tools/deps.sh --test`).
#
# Outputs land in build/bench/ (logs, metrics, lora.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/lora.py "$@"
exec "$PY" tools/bench/lora.py "${BENCH_ARGS[@]}"
