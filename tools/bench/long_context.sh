#!/usr/bin/env bash
# Step time and activation memory against sequence length (issue 21): the CPU
# backend's tiled attention against its materialized attention
# (SHARDLM_ATTENTION=materialized), a small Llama, 8192 tokens per step at
# T = 512 .. 8192, in one run (tools/bench/long_context.py says how).
#
#   bash tools/bench/long_context.sh [--threads N] [--coretype X] [--steps N] [--lengths 512,1024,...] [--no-build]
#
# Outputs land in build/bench/ (configs, metrics, long_context.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/long_context.py "$@"
exec "$PY" tools/bench/long_context.py "${BENCH_ARGS[@]}"
