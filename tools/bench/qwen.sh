#!/usr/bin/env bash
# The Qwen families on the CPU (issue 48): shardlm's LoRA step on a Qwen3 shape
# against PEFT 0.21 over transformers 5.25, and shardlm generate on a Qwen2.5
# shape against transformers' generate() at batch 1 and 8, in one run
# (tools/bench/qwen.py says how).
#
#   bash tools/bench/qwen.sh [--threads N] [--coretype X] [--steps N] [--warmup N] [--repeats R]
#        [--batches 1,8] [--new N] [--no-build]
#
# transformers runs under build/ref5-venv/bin/python (bash tools/deps.sh --test).
# Outputs land in build/bench/ (the models qwen_qwen3/, qwen_qwen25/, qwen.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/qwen.py "$@"
exec "$PY" tools/bench/qwen.py "${BENCH_ARGS[@]}"
