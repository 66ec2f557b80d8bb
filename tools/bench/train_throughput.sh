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

build=1
isa=native
args=()
prev=
for a in "$@"; do
    if [ "$a" = "--no-build" ]; then build=0; else args+=("$a"); fi
    [ "$prev" = "--isa" ] && isa=$a
    case $a in --isa=*) isa=${a#--isa=} ;; esac
    prev=$a
done
# The core type is checked against the CPU before anything is built or run.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$PY" tools/bench/train_throughput.py --check-only "${args[@]}" || exit $?
make_args=(all)
if [ "$isa" = avx2 ]; then
    # The same sources, as the compiler builds them on an AVX2-only machine
    # (-march=native on a Zen 3 means x86-64-v3 plus Zen 3 tuning).
    make_args=(OPT="-O3 -march=x86-64-v3 -mtune=znver3 -g" BUILD=build/avx2 BIN=build/avx2/bin build/avx2/bin/shardlm)
    export BENCH_SHARDLM=$PWD/build/avx2/bin/shardlm
fi

mkdir -p build/bench
if [ "$build" = 1 ]; then
    # Others may be mid-edit in src/: one retry after a pause.
    if ! make --no-print-directory "${make_args[@]}" >build/bench/make.log 2>&1; then
        echo "make failed; retrying in 60 s (tail of the log below)" >&2
        tail -5 build/bench/make.log >&2
        sleep 60
        make --no-print-directory "${make_args[@]}" >build/bench/make.log 2>&1 || { cat build/bench/make.log >&2; exit 1; }
    fi
    rm -f build/bench/make.log
fi
[ -x "${BENCH_SHARDLM:-bin/shardlm}" ] || { echo "${BENCH_SHARDLM:-bin/shardlm} missing; run make all" >&2; exit 1; }

BLAS_PC=${BLAS_PC:-openblas}
libdir=$(pkg-config --variable=libdir "$BLAS_PC" 2>/dev/null || true)
if [ ! -x build/bench/sgemm_peak ] || [ tools/bench/sgemm_peak.c -nt build/bench/sgemm_peak ]; then
    # shellcheck disable=SC2046
    gcc -O2 -Wall -Wextra -fopenmp tools/bench/sgemm_peak.c -o build/bench/sgemm_peak \
        $(pkg-config --cflags --libs "$BLAS_PC") ${libdir:+-Wl,-rpath,"$libdir"} -lm
fi

exec "$PY" tools/bench/train_throughput.py "${args[@]}"
