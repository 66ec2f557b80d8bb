#!/usr/bin/env bash
# Training throughput, shardlm against PyTorch, side by side in one run.
#
#   bash tools/bench/train_throughput.sh [--threads N] [--coretype X] [--steps N]
#        [--shapes small,124M] [--batch-124m B] [--steps-124m N] [--budget S]
#        [--rounds R] [--wait-quiet S] [--no-build]
#
#   --threads N     threads for both sides (default: all CPUs)
#   --coretype X    OPENBLAS_CORETYPE=X for both sides and sgemm_peak ("none" unsets it)
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

build=1
args=()
for a in "$@"; do
    if [ "$a" = "--no-build" ]; then build=0; else args+=("$a"); fi
done

mkdir -p build/bench
if [ "$build" = 1 ]; then
    # Others may be mid-edit in src/: one retry after a pause.
    if ! make --no-print-directory all >build/bench/make.log 2>&1; then
        echo "make all failed; retrying in 60 s (tail of the log below)" >&2
        tail -5 build/bench/make.log >&2
        sleep 60
        make --no-print-directory all >build/bench/make.log 2>&1 || { cat build/bench/make.log >&2; exit 1; }
    fi
    rm -f build/bench/make.log
fi
[ -x bin/shardlm ] || { echo "bin/shardlm missing; run make all" >&2; exit 1; }

BLAS_PC=${BLAS_PC:-openblas}
libdir=$(pkg-config --variable=libdir "$BLAS_PC" 2>/dev/null || true)
if [ ! -x build/bench/sgemm_peak ] || [ tools/bench/sgemm_peak.c -nt build/bench/sgemm_peak ]; then
    # shellcheck disable=SC2046
    gcc -O2 -Wall -Wextra -fopenmp tools/bench/sgemm_peak.c -o build/bench/sgemm_peak \
        $(pkg-config --cflags --libs "$BLAS_PC") ${libdir:+-Wl,-rpath,"$libdir"} -lm
fi

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" tools/bench/train_throughput.py "${args[@]}"
