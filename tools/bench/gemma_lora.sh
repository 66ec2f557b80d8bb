#!/usr/bin/env bash
# The Gemma 3 LoRA step on the CPU against PEFT's (issue 49): see tools/bench/gemma_lora.py.
#   bash tools/bench/gemma_lora.sh [--threads N] [--steps N] [--layers L] [--vocab V] [--seq T]
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory bin/shardlm >/dev/null
exec /usr/bin/python3 tools/bench/gemma_lora.py "$@"
