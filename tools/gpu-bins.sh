#!/usr/bin/env bash
# Build, here, the four programs the GPU session runs, for the GPU machine
# (issue 35, item 4), into gpu-bins/ (git-ignored; the device call carries it):
#
#   bash tools/gpu-bins.sh [DIR]          (default: gpu-bins at the repo root)
#
#   shardlm, shardlm-cuda    the trainers: CUDA code for sm_90 only (the H200), compressed,
#                            host code for a portable -march (GPU_BINS_MARCH,
#                            default x86-64-v2: not this CPU's native), no -g
#   check_kernels, time_kernels   tests/gpu's checkers, linked as the session's
#                            build stage links them
#   nvme_bench               tools/bench/nvme_bench.c, linked the same way (the
#                            session's nvme stage: issue 36's benchmark there)
#   refs/                    tests/gpu/e2e.py's CPU runs and plans, precomputed
#   build-nomake.sh          the fallback for a machine where they do not load
#                            and there is no make (tools/gpu-nomake.sh)
#   INFO.json                the commit (.git does not travel), when and with
#                            which nvcc and gcc they were built, and for each
#                            program its size and the newest glibc symbol
#                            version it needs (glibc_needed_max: the session's
#                            probe compares it with the machine's glibc)
#
# Objects go to build-gpu-bins/ (separate from build/, whose -march=native
# objects must not travel). Fails when DIR, the kit (GPU_KIT_DIR, default
# gpu-kit/, if assembled)
# and the working tree that travels are together over 64 MiB, the device
# call's limit. tests/gpu/session.sh uses DIR when all four programs are there
# and load on the machine, and compiles on the machine only otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu-bins}
B=build-gpu-bins
MARCH=${GPU_BINS_MARCH:-x86-64-v2}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
TRAVEL_LIMIT=$((64 * 1048576))
die() { echo "gpu-bins: $*" >&2; exit 1; }
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no $CUDA_HOME/bin/nvcc; set CUDA_HOME"

# the device code compressed for size (nvcc --compress-mode=size: the attention kernels' fatbin a seventh of
# the default's; the runtime unpacks a module when it first loads it), so the four programs fit the 64 MiB
ARGS=(CUDA=1 "BUILD=$B" "BIN=$B/bin" "OPT=-O3 -march=$MARCH -mtune=generic"
  "CUDA_ARCH=-gencode=arch=compute_90,code=sm_90" "NVCC_EXTRA=--compress-mode=size" "CUDA_HOME=$CUDA_HOME")
make --no-print-directory -j"$(nproc)" "${ARGS[@]}" check-deps "$B/bin/shardlm" "$B/bin/shardlm-cuda"
rm -rf "$DIR" && mkdir -p "$DIR"
cp "$B/bin/shardlm" "$B/bin/shardlm-cuda" "$DIR/"
bash tests/gpu/session.sh --link-checkers "$B" "$DIR" "${ARGS[@]}" || die "linking the checkers failed"
for f in shardlm shardlm-cuda check_kernels time_kernels nvme_bench; do strip --strip-debug "$DIR/$f"; done
# where they do not load and there is no make: the Makefile's recipes for gcc and nvcc alone
bash tools/gpu-nomake.sh "$DIR/build-nomake.sh"

# The CPU side of tests/gpu/e2e.py (each case's CPU run and `plan --target
# cuda`), precomputed here into DIR/refs so that the GPU machine spends its
# time on the GPU side (GPU_BINS_REFS=0: not)
if [ "${GPU_BINS_REFS:-1}" = 1 ]; then
  [ -x bin/shardlm ] || make --no-print-directory -j"$(nproc)" bin/shardlm
  refs_tmp=$(mktemp -d)
  E2E_PRECOMPUTE=1 E2E_REFS=$(cd "$DIR" && pwd)/refs SHARDLM_TEST_TMP=$refs_tmp /usr/bin/python3 tests/gpu/e2e.py >"$refs_tmp/log" 2>&1 ||
    { tail -5 "$refs_tmp/log" >&2; rm -rf "$refs_tmp"; die "precomputing the CPU references failed"; }
  rm -rf "$refs_tmp"
fi

# glibc: the newest GLIBC_x.y symbol version each program needs
glibc_of() { objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
/usr/bin/python3 - "$DIR" "$MARCH" "$(git rev-parse HEAD)$(git diff --quiet HEAD -- src tests/gpu Makefile || echo -dirty)" \
  "$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" "$(gcc -dumpfullversion)" \
  "$(getconf GNU_LIBC_VERSION | awk '{print $2}')" \
  "$(for f in shardlm shardlm-cuda check_kernels time_kernels; do echo "$f=$(glibc_of "$DIR/$f")"; done)" <<'EOF'
import datetime, json, os, sys
d, march, commit, nvcc, gcc, host_glibc, needs = sys.argv[1:8]
need = dict(x.split("=", 1) for x in needs.split())
key = lambda v: tuple(int(p) for p in v.split("."))
info = {"commit": commit, "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "march": march, "cuda_arch": "sm_90", "nvcc": nvcc, "gcc": gcc, "built_on_glibc": host_glibc,
        "glibc_needed_max": max(need.values(), key=key),
        "programs": {f: {"bytes": os.path.getsize(os.path.join(d, f)), "glibc_needed": v} for f, v in need.items()}}
with open(os.path.join(d, "INFO.json"), "w") as f:
    json.dump(info, f, indent=1)
print(json.dumps(info))
EOF

# what travels: the working tree (tracked and untracked-not-ignored files), the kit, DIR
tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s -- 2>/dev/null || true) |
  awk '{s += $1} END {print s + 0}')
KITDIR=${GPU_KIT_DIR:-gpu-kit}
kit=0
[ -d "$KITDIR" ] && kit=$(du -sb "$KITDIR" | cut -f1)
bins=$(du -sb "$DIR" | cut -f1)
total=$((tree + kit + bins))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "gpu-bins: $DIR $(mib "$bins") MiB; with the tree ($(mib "$tree") MiB) and gpu-kit ($(mib "$kit") MiB): $(mib "$total") MiB of 64"
[ "$total" -le "$TRAVEL_LIMIT" ] || die "the tree, gpu-kit and $DIR are $(mib "$total") MiB together, over the 64 MiB that travel"
