#!/usr/bin/env bash
# QLoRA step against LoRA step of the same model on the CPU, in one run, and
# each rank's peak host memory after reading the model (tools/bench/qlora.py
# says what it measures).
#
#   bash tools/bench/qlora.sh [--model DIR] [--ranks N] [--threads N] [--steps S] [--warmup W] [--seq T] [--micro B] [--r R]
#
# Outputs land in build/bench/qlora/ (configs, logs, metrics, qlora.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory bin/shardlm >/dev/null
exec /usr/bin/python3 tools/bench/qlora.py "$@"
