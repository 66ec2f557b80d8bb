#!/usr/bin/env bash
# Training throughput, shardlm against PyTorch, side by side in one run.
#
#   bash tools/bench/train_throughput.sh [--threads N] [--coretype X] [--isa native|avx2]
#        [--steps N] [--shapes small,124M] [--batch-124m B] [--steps-124m N] [--budget S]
#        [--rounds R] [--wait-quiet S] [--no-build]
#
#   --threads N     threads for both sides (default: all CPUs)
#   --coretype X    OPENBLAS_CORETYPE=X for both sides and sgemm_peak: a core type
#                   this CPU's flags allow (others are refused before anything runs,
#                   naming the missing flags), "auto" (the best the flags allow; the
#                   default when the environment sets none) or "none" (unset it:
#                   OpenBLAS's own detection). tools/bench/coretype.py lists them.
#   --isa avx2      measure as an AVX2-only CPU would run: shardlm built for
#                   x86-64-v3 (tuned for Zen 3) into build/avx2/, torch's kernels
#                   capped at AVX2, AVX-512 core types refused
#   --steps N       steps per run, the first 2 (--warmup) not counted (default 10)
#   --budget S      seconds per side and shape; past it a run stops after warm-up + 2
#                   steps (default 120; keeps the Prescott-kernel 124M run in time)
#   --rounds R      alternate shardlm/torch R times per shape, keep each side's best median
#   --wait-quiet S  before each run wait up to S s for the CPUs to be idle (default 20,
#                   90 s in all): the machine may be shared with other jobs
#
# Builds bin/shardlm (make all) and build/bench/sgemm_peak, then runs
# tools/bench/train_throughput.py: for each shape a full training step
# (forward, backward, clip, AdamW) in bin/shardlm and in tools/bench/torch_gpt2.py
# with the same model, batch, sequence, padded vocabulary and threads, and
# prints tokens/s, the ratio, and MFU against an sgemm peak measured in the
# same run.
#
# Environment for every side: OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N
# OMP_WAIT_POLICY=passive, and OPENBLAS_CORETYPE as given in the environment
# (or by --coretype X, "--coretype none" to unset it). OpenBLAS 0.3.21 does
# not recognise some recent CPUs and falls back to its Prescott (SSE3)
# kernels; OPENBLAS_CORETYPE=SkylakeX selects the AVX-512 ones. The kernel
# that ran is printed (openblas_get_corename()) for sgemm_peak and torch.
#
# Outputs land in build/bench/ (logs, metrics, train_throughput.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/bench/build_bench.sh
. tools/bench/build_bench.sh
bench_build tools/bench/train_throughput.py "$@"
exec "$PY" tools/bench/train_throughput.py "${BENCH_ARGS[@]}"
