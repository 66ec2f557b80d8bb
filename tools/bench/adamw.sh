#!/usr/bin/env bash
# Host AdamW: shardlm's fused pass against PyTorch and the memory bandwidth,
# all measured in one run.
#
#   bash tools/bench/adamw.sh [--threads N] [--n N] [--rounds R] [--torch-steps S]
#        [--tensors K] [--wait-quiet S] [--no-build]
#
#   --threads N      threads for both sides (default: $OMP_NUM_THREADS, else all CPUs)
#   --n N            parameters (default 100000000)
#   --rounds R       adamw_bench rounds, every variant and probe once per round (default 7)
#   --torch-steps S  timed torch steps per variant, after 2 untimed (default 5)
#   --tensors K      torch parameters as K equal tensors (default 1)
#   --wait-quiet S   before each side wait up to S s for the CPUs to be idle (default 30):
#                    the machine may be shared, and bandwidth is shared with everyone
#
# Environment: as given, plus OMP_NUM_THREADS=N for both sides (torch also gets
# torch.set_num_threads(N)); the relevant variables are printed.
#
# Steps: builds build/bench/adamw_bench (gcc -O3 -march=native, like the
# Makefile's build), runs tools/bench/adamw_torch.py (Debian's /usr/bin/python3,
# python3-torch) for torch.optim.AdamW foreach=True and foreach=False, then
# adamw_bench with those times: bandwidth probes, the fused pass with each
# param_out dtype and store kind, and the previous compiler-vectorised loop,
# and prints the table (ms/step, bytes per parameter, GB/s, % of the measured
# bandwidth, ratio to torch). See adamw_bench.c for how bytes are counted.
# Output also lands in build/bench/adamw.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=${OMP_NUM_THREADS:-$(nproc)}
n=100000000
rounds=7
torch_steps=5
tensors=1
wait_quiet=30
build=1
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --torch-steps) torch_steps=$2; shift 2 ;;
    --tensors) tensors=$2; shift 2 ;;
    --wait-quiet) wait_quiet=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "adamw.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

out=build/bench
mkdir -p "$out"
bench=$out/adamw_bench
if [ "$build" = 1 ]; then
    gcc -std=gnu11 -O3 -march=native -fopenmp -Wall -Wextra -Werror -Wno-unused-parameter -iquote src \
        tools/bench/adamw_bench.c src/core/adamw.c src/core/dtype.c src/core/util.c \
        $(pkg-config --cflags --libs jansson) -lm -o "$bench"
fi

# Busy share of all CPUs over one second, in percent.
cpu_busy_percent() {
    local a b
    read -r _ a1 a2 a3 a4 a5 a6 a7 a8 _ < /proc/stat
    sleep 1
    read -r _ b1 b2 b3 b4 b5 b6 b7 b8 _ < /proc/stat
    local busy=$(( (b1 + b2 + b3 + b6 + b7 + b8) - (a1 + a2 + a3 + a6 + a7 + a8) ))
    local total=$(( busy + (b4 + b5) - (a4 + a5) ))
    echo $(( total > 0 ? 100 * busy / total : 0 ))
}

wait_for_quiet() {
    local waited=0 busy
    while [ "$waited" -lt "$wait_quiet" ]; do
        busy=$(cpu_busy_percent)
        [ "$busy" -le 10 ] && break
        waited=$((waited + 1))
    done
    [ "$waited" -gt 0 ] && echo "(waited ${waited} s for other processes to quiet down before $1; CPUs ${busy}% busy)"
    return 0
}

export OMP_NUM_THREADS=$threads
{
    echo "adamw benchmark: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "environment: $(env | grep -E '^(OMP_|GOMP_|KMP_|OPENBLAS_|MKL_|OMP_WAIT)' | sort | tr '\n' ' ')"
    echo "command: bash tools/bench/adamw.sh --threads $threads --n $n --rounds $rounds --torch-steps $torch_steps --tensors $tensors"
    wait_for_quiet "torch"
    torch_json=$(/usr/bin/python3 tools/bench/adamw_torch.py --n "$n" --threads "$threads" --steps "$torch_steps" \
        --tensors "$tensors")
    echo "$torch_json" | sed 's/^/torch: /'
    foreach_ms=$(echo "$torch_json" | /usr/bin/python3 -c 'import json,sys; print(next(d["median_ms"] for d in map(json.loads, sys.stdin) if d["variant"] == "foreach"))')
    loop_ms=$(echo "$torch_json" | /usr/bin/python3 -c 'import json,sys; print(next(d["median_ms"] for d in map(json.loads, sys.stdin) if d["variant"] == "loop"))')
    wait_for_quiet "adamw_bench"
    "$bench" --n "$n" --rounds "$rounds" --torch-foreach-ms "$foreach_ms" --torch-loop-ms "$loop_ms"
} 2>&1 | tee "$out/adamw.txt"
