#!/usr/bin/env bash
# Llama training throughput: shardlm against Hugging Face transformers'
# LlamaForCausalLM, side by side in one run, with the sgemm peak measured in
# the same run.
#
#   bash tools/bench/train_llama.sh [--threads N] [--coretype X] [--isa native|avx2]
#        [--steps N] [--steps-12l N] [--batch-small B] [--batch-12l B] [--shapes small,12L]
#        [--hf-attn auto|eager|sdpa] [--budget S] [--rounds R] [--wait-quiet S] [--no-build]
#
# Shapes (both sides: fp32, untied head, the same micro-batch, sequence and threads):
#   small  4 layers, C 256, 4 heads / 2 KV heads, FFN 688, vocab 8192, T 256, B 8, 12 steps
#   12L    12 layers, C 768, 12 heads / 4 KV heads, FFN 2048, vocab 32000, T 512, B 8, 6 steps (B 8: 4096 rows per matmul)
# The first 2 steps (--warmup) of each run are not counted. Prints per shape
# shardlm tok/s, transformers tok/s, their ratio and shardlm's fraction of the
# sgemm peak, each with the CPU model; targets: ratio >= 1.5 on both shapes,
# >= 70% of the sgemm peak on 12L. About 5 minutes on a quiet 2-core machine
# (about 9 with --rounds 2).
#
# --threads, --coretype, --isa, --budget, --rounds, --wait-quiet and --no-build
# are train_throughput.sh's (see there). The transformers side runs under
# build/ref-venv/bin/python (transformers 4.40.2 over Debian's torch 1.13; make
# it with `bash tools/deps.sh --test`); on torch 1.13 its attention is "eager"
# (transformers' "sdpa" needs torch >= 2.1.1).
#
# Outputs land in build/bench/ (logs, metrics, train_llama.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/train_llama.py "$@"
exec "$PY" tools/bench/train_llama.py "${BENCH_ARGS[@]}"
