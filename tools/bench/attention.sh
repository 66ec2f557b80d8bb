#!/usr/bin/env bash
# The CPU backend's attention kernels, tiled (FlashAttention-2, the default)
# against materialized (the T x T probabilities), forward + backward in one
# run (issue 21).
#
#   bash tools/bench/attention.sh [--threads N] [--coretype X] [--no-build]
#        [attention_bench args: --B --NH --NKV --hs --rounds, T ...]
#
# Defaults: B 1, 12 heads over 4 key/value heads of 64 channels, T 256 .. 4096,
# 5 rounds, threads $OMP_NUM_THREADS or all CPUs, OpenBLAS core type "auto"
# (tools/bench/coretype.py: the best kernels the CPU runs; Debian's OpenBLAS
# falls back to its generic ones on newer CPUs). Builds bin/shardlm's objects
# (make all) and build/bench/attention_bench linked against them.
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${OMP_NUM_THREADS:-$(nproc)}
build=1
coretype=auto
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads=$2; shift 2 ;;
    --coretype) coretype=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) args+=("$1"); shift ;;
    esac
done
mkdir -p build/bench
if [ "$build" = 1 ]; then
    make --no-print-directory all >build/bench/make.log 2>&1 || { tail -20 build/bench/make.log >&2; exit 1; }
    # shellcheck disable=SC2016  # $($*) is make's
    make_var() { make -s --no-print-directory --eval 'print-%: ; @echo $($*)' "print-$1"; }
    objs=()
    mapfile -t objs < <(find build/src -name '*.o' | sort | grep -v '/main\.o$')
    # shellcheck disable=SC2046  # word lists from make
    gcc $(make_var CFLAGS) tools/bench/attention_bench.c "${objs[@]}" -o build/bench/attention_bench $(make_var LDLIBS)
fi
core=$(python3 -c 'import sys; sys.path.insert(0, "tools/bench"); import coretype
try:
    print(coretype.resolve(sys.argv[1]) or "")
except coretype.CoretypeError as e:
    sys.exit(f"attention.sh: {e}")' "$coretype")
grep -m1 'model name' /proc/cpuinfo | sed 's/^model name\s*: /CPU: /'
echo "OPENBLAS_CORETYPE=${core:-(unset)}"
if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; else unset OPENBLAS_CORETYPE; fi
OMP_NUM_THREADS=$threads build/bench/attention_bench "${args[@]}"
