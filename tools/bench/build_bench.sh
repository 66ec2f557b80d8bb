# shellcheck shell=bash
# Sourced by tools/bench/train_throughput.sh and train_llama.sh: what runs
# before a training-throughput driver.
#
#   bench_build DRIVER.py ARGS...
#
# Checks ARGS with the driver's --check-only (a core type the CPU cannot run is
# refused before anything is built), builds bin/shardlm (make all; with
# --isa avx2 the same sources for x86-64-v3 into build/avx2/, and exports
# BENCH_SHARDLM to it) and build/bench/sgemm_peak, unless ARGS has --no-build.
# Sets PY (the interpreter for the driver) and BENCH_ARGS (ARGS less --no-build).
# Expects the repository root as the working directory.

bench_build() {
    local driver=$1
    shift
    local build=1 isa=native prev='' a
    BENCH_ARGS=()
    for a in "$@"; do
        if [ "$a" = "--no-build" ]; then build=0; else BENCH_ARGS+=("$a"); fi
        [ "$prev" = "--isa" ] && isa=$a
        case $a in --isa=*) isa=${a#--isa=} ;; esac
        prev=$a
    done
    PY=/usr/bin/python3
    [ -x "$PY" ] || PY=python3
    "$PY" "$driver" --check-only "${BENCH_ARGS[@]}" || exit $?
    local make_args=(all)
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

    local blas_pc=${BLAS_PC:-openblas} libdir
    libdir=$(pkg-config --variable=libdir "$blas_pc" 2>/dev/null || true)
    if [ ! -x build/bench/sgemm_peak ] || [ tools/bench/sgemm_peak.c -nt build/bench/sgemm_peak ]; then
        # shellcheck disable=SC2046
        gcc -O2 -Wall -Wextra -fopenmp tools/bench/sgemm_peak.c -o build/bench/sgemm_peak \
            $(pkg-config --cflags --libs "$blas_pc") ${libdir:+-Wl,-rpath,"$libdir"} -lm
    fi
}
