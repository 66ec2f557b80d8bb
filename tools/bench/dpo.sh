#!/usr/bin/env bash
# DPO step time (issue 37): shardlm's DPO with LoRA against TRL's DPOTrainer
# with PEFT (a PyTorch loop with the same loss where TRL cannot run), and
# shardlm's DPO step against its SFT step on the same tokens (LoRA; full
# fine-tune with the reference precomputed), in one run. See tools/bench/dpo.py.
#
#   bash tools/bench/dpo.sh [--threads N] [--coretype X] [--isa native|avx2] [--steps N]
#        [--shape 12L|small] [--r R] [--alpha A] [--pairs N] [--ref-python PY] [--ref-impl auto|trl|loop]
#        [--only RUNS] [--budget S] [--rounds R] [--wait-quiet S] [--no-build]
#
# The reference's venv with TRL: bash tools/bench/trl_venv.sh /tmp/shardlm-trl-venv (once; dpo.py finds it
# there, or give --ref-python). Without it the reference is the PyTorch loop under build/ref-venv.
# Targets: shardlm DPO LoRA >= 1.5x the reference's tokens/s; DPO LoRA step <= 1.6x the SFT LoRA step;
# DPO full step <= 1.1x the SFT full step. About 15 minutes on a quiet 2-core machine (12L).
# Outputs land in build/bench/ (logs, metrics, dpo.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/dpo.py "$@"
exec "$PY" tools/bench/dpo.py "${BENCH_ARGS[@]}"
