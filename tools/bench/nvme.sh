#!/usr/bin/env bash
# Optimizer state on NVMe (offload_optimizer "device": "nvme"): the streamed
# AdamW step of src/zero/nvme.c against a plain sequential O_DIRECT read + write of
# the same bytes on the same disk, in one run (target: ratio >= 0.8).
#
#   bash tools/bench/nvme.sh [--dir DIR] [--n N] [--piece P] [--buffers B] [--rounds R] [--no-build]
#                            [--no-step] [--step-only] [--accum A] [--micro M] [--step-rounds R]
#
#   --dir DIR     a directory on the disk to measure (default build/bench/nvme: the worktree's disk)
#   --n N         fp32 parameters whose master, m and v move (default 16777216: 192 MiB on disk)
#   --piece P     elements per piece (default 2097152: 24 MiB per buffer)
#   --buffers B   pinned buffers (default 4)
#   --rounds R    rounds, medians printed (default 5)
#   --no-step     leave out the second figure; --step-only: the second figure alone
#   --accum A, --micro M, --step-rounds R   the second figure's gradient accumulation
#                 (default 16), micro-batch (1) and alternations of the two sides (1)
#
# Builds bin/shardlm's objects (make all) and build/bench/nvme_bench from them, runs it,
# prints the CPU, the disk's file system and the table; output also lands in
# build/bench/nvme.txt. The second figure (tools/bench/nvme_step.py): the training
# step of bin/shardlm with offload_optimizer "nvme" (its file under DIR) against the
# same step with "cpu", 12-layer Llama, gradient accumulation 16 (target: <= 1.3x).
set -euo pipefail
cd "$(dirname "$0")/../.."

dir=build/bench/nvme
args=()
build=1
step=1
first=1
step_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --dir) dir=$2; shift 2 ;;
    --n|--piece|--buffers|--rounds) args+=("$1" "$2"); shift 2 ;;
    --accum|--micro) step_args+=("$1" "$2"); shift 2 ;;
    --step-rounds) step_args+=(--rounds "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    --no-step) step=0; shift ;;
    --step-only) first=0; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "nvme.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

out=build/bench
mkdir -p "$out" "$dir"
bench=$out/nvme_bench
if [ "$build" = 1 ]; then
    # the library objects of the Makefile's build (make all first)
    make --no-print-directory -j2 all >"$out/make-nvme.log" 2>&1 || { tail -20 "$out/make-nvme.log" >&2; exit 1; }
    mapfile -t objs < <(find build/src -name '*.o' | sort | grep -v '/main\.o$')
    gcc -std=gnu11 -O3 -march=native -fopenmp -Wall -Wextra -Werror -Wno-unused-parameter -iquote src \
        $(pkg-config --cflags ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc liburing nettle) tools/bench/nvme_bench.c "${objs[@]}" \
        $(pkg-config --libs ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc liburing nettle) -lm -o "$bench"
fi
{
    echo "nvme benchmark: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "disk: $(df -T "$dir" | awk 'NR == 2 {print $1, $2}') at $dir"
    echo "command: bash tools/bench/nvme.sh --dir $dir ${args[*]} ${step_args[*]}"
    if [ "$first" = 1 ]; then "$bench" --dir "$dir" "${args[@]}"; fi
    if [ "$step" = 1 ]; then /usr/bin/python3 tools/bench/nvme_step.py --dir "$dir" "${step_args[@]}"; fi
} 2>&1 | tee "$out/nvme.txt"
