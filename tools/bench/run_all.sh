#!/usr/bin/env bash
# Every benchmark of tools/bench/, one after the other (long: tens of minutes
# on a 2-core machine). Each prints its own table with the reference measured
# in the same run. Pass --coretype X to select OpenBLAS kernels for all (default:
# the best the CPU supports; see tools/bench/coretype.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
core=()
[ "${1:-}" = "--coretype" ] && core=(--coretype "$2")
bash tools/bench/train_throughput.sh "${core[@]}"
if [ -x build/ref-venv/bin/python ]; then
    bash tools/bench/train_llama.sh --no-build "${core[@]}"
    # LoRA (issue 19): shardlm's LoRA step against its full step and PEFT's LoRA (~6 minutes)
    bash tools/bench/lora.sh --no-build "${core[@]}"
    # DPO (issue 37): shardlm's DPO (LoRA) against TRL's DPOTrainer (tools/bench/trl_venv.sh; else a PyTorch
    # loop) and its DPO step against its SFT step (~15 minutes)
    bash tools/bench/dpo.sh --no-build "${core[@]}"
else
    echo "train_llama, lora: skipped: build/ref-venv (transformers, peft) missing; make it with bash tools/deps.sh --test"
fi
python3 tools/bench/zero_overlap.py "${core[@]}"
# CPU attention: tiled against materialized, T 256 .. 4096 (issue 21; ~2 minutes)
bash tools/bench/attention.sh "${core[@]}"
python3 tools/bench/memory_ladder.py
[ -f tools/bench/adamw.sh ] && bash tools/bench/adamw.sh
# Hugging Face import/export of a ~1B Llama (~8.5 minutes; ~22 GiB of memory, ~19 GB of disk in /tmp)
bash tools/bench/hf_io.sh --no-build
# instruction data at skewed lengths: fixed padding, dynamic padding, group_by_length, packing (issue 18)
python3 tools/bench/packing.py "${core[@]}"
# the Qwen families (issue 48): Qwen3 LoRA step against PEFT 0.21, Qwen2.5 generate against transformers 5.25
# (build/ref5-venv; ~5 minutes)
if [ -x build/ref5-venv/bin/python ]; then
    bash tools/bench/qwen.sh --no-build "${core[@]}"
else
    echo "qwen: skipped: build/ref5-venv (transformers 5.25, peft 0.21) missing; make it with bash tools/deps.sh --test"
fi
