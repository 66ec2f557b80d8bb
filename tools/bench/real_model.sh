#!/usr/bin/env bash
# shardlm on the real SmolLM2-135M-Instruct against transformers and PEFT
# (issue 33): generate tokens/s at batch 1 and 8, and the LoRA step; see
# tools/bench/real_model.py. Needs bin/shardlm (make) and build/ref-venv
# (tools/deps.sh --test); the model comes from tools/real_model.sh.
#   bash tools/bench/real_model.sh [--threads N] [--new N] [--steps N] [--warmup N] [--seq T]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec build/ref-venv/bin/python tools/bench/real_model.py "$@"
