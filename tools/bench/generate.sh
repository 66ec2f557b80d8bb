#!/usr/bin/env bash
# Greedy generation speed (issue 20): shardlm generate against transformers'
# generate() on train_llama.sh's 12L Llama shape, prompt 128 tokens, 256 new,
# batch 1 and 8, in one run (tools/bench/generate.py says how).
#
#   bash tools/bench/generate.sh [--threads N] [--coretype X] [--repeats R] [--batches 1,8] [--new N] [--no-build]
#
# transformers runs under build/ref-venv/bin/python (bash tools/deps.sh --test).
# Outputs land in build/bench/ (the model generate_12L/, generate.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/generate.py "$@"
exec "$PY" tools/bench/generate.py "${BENCH_ARGS[@]}"
