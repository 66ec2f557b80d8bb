#!/usr/bin/env bash
# The whole GPU check in one command, for a bare GPU machine (issue 15):
#
#   OUT=DIR bash tests/gpu/session.sh [--rehearse] [--stages probe,build,...]
#
# Stages, each under its own time limit (timeout), each run even when an
# earlier one failed, all within SESSION_BUDGET seconds (default 540: 9 min):
#   probe       (60 s)  nvidia-smi (compute mode, MIG, clocks, memory), nvcc,
#                       where cuBLAS and NCCL are (the nvidia-nccl-cu13 wheel's
#                       libnccl.so.2 gets a libnccl.so link in $SESSION_WORK/nccl,
#                       the build's NCCL_HOME), which Python has numpy and torch
#                       (with CUDA?), compute-sanitizer, the machine's glibc, OS,
#                       gcc and make; defaults are written before it runs
#   build      (150 s)  the carried binaries of gpu-bins/ (tools/gpu-bins.sh:
#                       sm_90, portable -march) when all four load; else
#                       make CUDA=1 WERROR= bin/shardlm bin/shardlm-cuda, sm_90
#                       only (KIT=gpu-kit when gpu-kit/ is there: MPI, HDF5,
#                       jansson, OpenBLAS come from it), then check_kernels and
#                       time_kernels linked against the CUDA backend objects;
#                       with no make on the machine, build-nomake.sh of gpu-bins/
#                       or gpu-kit/ (tools/gpu-nomake.sh: the Makefile's recipes
#                       for gcc and nvcc alone) builds the same four programs
#   kernels     (60 s)  check_kernels (every kernel against the CPU backend); if it
#                       fails, again under compute-sanitizer memcheck with
#                       CUDA_LAUNCH_BLOCKING=1
#   e2e        (180 s)  tests/gpu/e2e.py: CUDA build vs CPU build (precomputed
#                       in gpu-bins/refs where present), fp32/bf16, N=1 over
#                       NCCL, N=2 on one GPU host-staged MPI, offload
#   nvme        (60 s)  nvme_bench (tools/bench/nvme_bench.c, linked with the
#                       checkers): the streamed AdamW step of offload_optimizer
#                       "nvme" against a plain O_DIRECT read + write of the
#                       same 768 MiB on the machine's own disk (issue 36)
#   throughput (420 s)  tests/gpu/throughput.py: GPT-2 350M bf16, accumulation 1
#                       and 8, 12 steps a run, shardlm and PyTorch alternated
#                       twice: median tokens/s and MFU (vs 989 TFLOP/s and vs a
#                       measured bf16 GEMM) of the last 8 steps; Llama 12L
#                       (issue 45) and the 8B-wide Llama workload: full fine-tune
#                       with offload vs FSDP2 CPUOffloadPolicy, LoRA r 16 vs PEFT,
#                       SESSION_8B_LAYERS layers (default 4) of Llama-3.1-8B's width;
#                       SESSION_THROUGHPUT_PARTS (gpt2,llama12l,llama8b) picks parts:
#                       all stages do not fit one 10-minute device call, so issue
#                       45's session is two: --stages probe,build,kernels,timings,
#                       then --stages probe,build,throughput with
#                       SESSION_THROUGHPUT_PARTS=llama8b
#   timings     (90 s)  time_kernels: each backend operation at the 350M shapes;
#                       then (issue 45) at a Llama-3.1-8B layer's shapes, the
#                       attention through cuDNN and through the tensor-core
#                       kernel: attention TFLOP/s (d 128, T 2048, causal, bf16),
#                       RMSNorm and layernorm backward bandwidth
# Limits: SESSION_LIMIT_<STAGE> (e.g. SESSION_LIMIT_E2E=200) override them.
#
# Output, in $OUT (default build/gpu-session), at most 8 files: session.log
# (everything, stage by stage), results.json (commit, machine, binaries,
# clocks; per stage: status pass/fail/skip/timeout, seconds, limit, checks
# passed/failed, failed and skipped check names, figures), metrics.jsonl
# (every training run's rows) and smi.csv (nvidia-smi each second; GPU only).
# Between stages, GPU processes left behind are listed and killed. Scratch (the NCCL links,
# the checkers, probe results) goes to $SESSION_WORK (default
# build/gpu-session-work). Ends with a table and "N passed, N failed" (stages;
# a timeout is a failure, a skip neither); exit status 0 when none failed.
#
# --rehearse (or SESSION_EMULATE=1): without a GPU, every stage that can run,
# through tests/cudaemu's CPU emulation of the CUDA sources: the probe reports
# no GPU without failing, the build also builds build/cudaemu/, the kernels,
# e2e (tiny model; SESSION_E2E_CASES picks cases), throughput and timings
# stages run the emulated binaries at tiny shapes (numbers meaningless, marked
# "emulated"). tests/t_gpu_session.sh runs it.
#
# A stage's log counts "ok NAME" / "FAIL NAME: why" / "skip NAME: why" lines;
# "@figure {json}" lines merge into the stage's figures; "@skip why" marks the
# whole stage skipped. Stage bodies run as `session.sh --stage-body NAME`.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
SELF=$ROOT/tests/gpu/session.sh
ALL_STAGES="probe build kernels e2e nvme throughput timings"
# stage time limits in seconds (the brief's: at most 9 minutes in all)
declare -A LIMIT=([probe]=60 [build]=150 [kernels]=60 [e2e]=180 [nvme]=60 [throughput]=420 [timings]=90)

usage() { sed -n '2,/^set -u/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; }

# ---- stage bodies (each runs in its own process under timeout) -------------

say() { echo "$@"; }
ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "skip $1: $2"; }
# "@figure" line from KEY=VALUE words (VALUE kept as a string; numbers as numbers)
figure() { "${PY:-python3}" - "$@" <<'EOF'
import json, sys
def val(v):
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v
print("@figure " + json.dumps({k: val(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}))
EOF
}

# find_lib MODULE SONAME: where SONAME is: the nvidia-MODULE wheel of any candidate Python first (the GPU
# machine's only NCCL; PyTorch's cuDNN), then ldconfig, then the CUDA toolkit.
find_lib() {
  local p d
  for p in ${SESSION_PYTHON:-} /opt/torch/.venv/bin/python /usr/bin/python3 python3; do
    command -v "$p" >/dev/null 2>&1 || continue
    d=$("$p" -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2>/dev/null) || continue
    [ -e "$d/lib/$2" ] && { echo "$d/lib/$2"; return 0; }
  done
  d=$(ldconfig -p 2>/dev/null | awk -v so="$2" '$1 == so {print $NF; exit}')
  [ -n "$d" ] && { echo "$d"; return 0; }
  for d in "$CUDA_HOME"/lib64 "$CUDA_HOME"/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$2" ] && { echo "$d/$2"; return 0; }
  done
  return 1
}
find_nccl() { find_lib nccl libnccl.so.2; }
# cuDNN (issue 45; cuDNN's attention dlopens it)
find_cudnn() { find_lib cudnn libcudnn.so.9; }

stage_probe() {
  local gpu=0 lib hdr cudnn= cudnn_ver=
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=1
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current,clocks.sm,clocks.max.sm,clocks.mem,memory.total,memory.used,power.limit --format=csv
    ok probe.gpu
  elif [ "$EMULATE" = 1 ]; then
    skip probe.gpu "no GPU visible (rehearsal: the CUDA sources run under tests/cudaemu)"
  else
    fail probe.gpu "nvidia-smi sees no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
  if [ -x "$CUDA_HOME/bin/nvcc" ]; then
    "$CUDA_HOME/bin/nvcc" --version | tail -2
    ok probe.nvcc
  else
    fail probe.nvcc "no $CUDA_HOME/bin/nvcc; set CUDA_HOME"
  fi
  # lib64 in a toolkit, lib in the nvidia-cublas wheel
  lib=$(ls "$CUDA_HOME"/lib64/libcublas.so* "$CUDA_HOME"/lib/libcublas.so* 2>/dev/null | head -1)
  [ -n "$lib" ] && { say "cuBLAS: $lib"; ok probe.cublas; } || fail probe.cublas "no libcublas.so in $CUDA_HOME/lib64 or lib"
  # NCCL: $WORK/nccl/{include/nccl.h, lib/libnccl.so, lib/libnccl.so.2} -> the real files
  rm -rf "$WORK/nccl" && mkdir -p "$WORK/nccl/include" "$WORK/nccl/lib"
  if lib=$(find_nccl); then
    hdr=$(dirname "$lib")/../include/nccl.h
    [ -e "$hdr" ] || hdr=$CUDA_HOME/include/nccl.h
    ln -s "$lib" "$WORK/nccl/lib/libnccl.so.2" && ln -s "$lib" "$WORK/nccl/lib/libnccl.so"
    [ -e "$hdr" ] && ln -s "$(readlink -f "$hdr")" "$WORK/nccl/include/nccl.h"
    say "NCCL: $lib (header $hdr; links in $WORK/nccl)"
    [ -e "$hdr" ] && ok probe.nccl || fail probe.nccl "found $lib but no nccl.h beside it or in $CUDA_HOME/include"
  else
    fail probe.nccl "no libnccl.so.2 (wheel nvidia-nccl-cu13, ldconfig, $CUDA_HOME)"
  fi
  # cuDNN (issue 45): the stages' SHARDLM_CUDNN_LIB; without it the attention runs the tensor-core kernel
  if cudnn=$(find_cudnn); then
    cudnn=$(readlink -f "$cudnn")
    cudnn_ver=$(python3 -c 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).cudnnGetVersion())' "$cudnn" 2>/dev/null)
    say "cuDNN: $cudnn (version ${cudnn_ver:-unknown}; the build's headers: 91900)"
    ok probe.cudnn
  else
    cudnn=
    skip probe.cudnn "no libcudnn.so.9 (wheel nvidia-cudnn-cu13, ldconfig, $CUDA_HOME): the attention runs the tensor-core kernel"
  fi
  # one interpreter start per candidate (torch imports take seconds): the first with numpy and torch wins
  local p info py_np= py_torch= torch_ver= cuda_torch=no san
  for p in ${SESSION_PYTHON:-} /opt/torch/.venv/bin/python /usr/bin/python3 python3; do
    command -v "$p" >/dev/null 2>&1 || continue
    info=$("$p" -c 'import numpy
try:
    import torch
    print(torch.__version__, "yes" if torch.cuda.is_available() else "no")
except ImportError:
    print("none no")' 2>/dev/null) || continue
    [ -z "$py_np" ] && py_np=$(command -v "$p")
    if [ "${info% *}" != none ]; then
      py_np=$(command -v "$p") py_torch=$py_np torch_ver=${info% *} cuda_torch=${info#* }
      break
    fi
  done
  [ -n "$py_np" ] && { say "numpy: $py_np"; ok probe.python_numpy; } ||
    fail probe.python_numpy "no Python imports numpy (e2e and throughput need it); set SESSION_PYTHON"
  if [ -n "$py_torch" ]; then
    say "torch: $py_torch ($torch_ver, CUDA $cuda_torch)"
    if [ "$cuda_torch" = yes ] || [ "$EMULATE" = 1 ]; then ok probe.python_torch; else
      fail probe.python_torch "$py_torch's torch sees no CUDA device"; fi
  else
    fail probe.python_torch "no Python imports numpy and torch; set SESSION_PYTHON"
  fi
  san=$(command -v compute-sanitizer || ls "$CUDA_HOME/bin/compute-sanitizer" 2>/dev/null || true)
  # the machine's C library, OS, compiler and make, beside what the carried binaries need
  local glibc os gccv makev need
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
  gccv=$(gcc -dumpfullversion 2>/dev/null || echo none) makev=$(make --version 2>/dev/null | head -1 || true)
  say "machine: glibc ${glibc:-?}, ${os:-unknown OS}, gcc ${gccv}, ${makev:-no make}"
  need=$(sed -n 's/.*"glibc_needed_max": *"\([0-9.]*\)".*/\1/p' "$BINS/INFO.json" 2>/dev/null | head -1)
  if [ -z "$need" ]; then say "carried binaries: none in $BINS (the build stage compiles here)"
  elif [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | tail -1)" != "$glibc" ]; then
    fail probe.glibc "the carried binaries need glibc $need, this machine has $glibc: the build stage compiles here instead"
  else ok probe.glibc; fi
  say "compute-sanitizer: ${san:-none}"
  say "MPI: $(command -v mpirun || echo none) ${OPAL_PREFIX:+(OPAL_PREFIX $OPAL_PREFIX)}; kit: ${KIT_ARG:-none (system libraries)}"
  {
    printf 'GPU_VISIBLE=%q\nNCCL_REAL=%q\nPY=%q\nTORCH_PY=%q\nSANITIZER=%q\nCUDNN_LIB=%q\n' "$gpu" "${lib:-}" \
      "${py_np:-python3}" "${py_torch:-${py_np:-python3}}" "$san" "$cudnn"
  } >"$WORK/probe.env"
  PY=${py_np:-python3} figure gpu_visible="$gpu" nccl="${lib:-}" cuda_home="$CUDA_HOME" python="${py_np:-}" \
    torch_python="${py_torch:-}" torch_cuda="$cuda_torch" compute_sanitizer="${san:-}" cudnn="${cudnn:-}" \
    cudnn_version="${cudnn_ver:-}" \
    gpu="$(nvidia-smi --query-gpu=name,compute_mode,mig.mode.current,clocks.max.sm,memory.total --format=csv,noheader 2>/dev/null | head -1)" \
    nvcc="$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')" \
    glibc="${glibc:-}" os="${os:-}" gcc="$gccv" make="${makev:-none}" carried_glibc_needed="${need:-}"
}

# The make variables of this build (KIT-aware: whatever the Makefile computes;
# warnings not fatal, as in the trainers' build here: the machine's compiler may
# be newer); MK_<NAME> instead where set (build-nomake.sh sets them: no make there).
make_var() {
  local v=MK_$1
  if [ -n "${!v+set}" ]; then echo "${!v}"; else
    make -s --no-print-directory CUDA=1 WERROR= "${MAKE_ARGS[@]}" --eval 'print-%: ; @echo $($*)' "print-$1" | tail -1; fi
}

# link_checkers BUILD DIR: check_kernels and time_kernels into DIR, against the
# CUDA backend objects in BUILD (build/ or tools/gpu-bins.sh's), linked as the
# trainer is; MAKE_ARGS are that build's make arguments.
link_checkers() {
  local b=$1 d=$2 cflags ldlibs cudalibs objs
  cflags=$(make_var CFLAGS) ldlibs=$(make_var LDLIBS) cudalibs=$(make_var CUDA_LIBS)
  # the objects of today's sources (a stale object of a moved or deleted source is never linked)
  objs=$(find src -name '*.c' | sort | sed "s#^src/\(.*\)\.c\$#$b/src/\1.o#" | grep -v -e '/main.o$' -e '/backend_cpu')
  cuda_objs=$(for f in src/backend/cuda/*.cu; do f=${f##*/}; echo "$b/cuda/${f%.cu}.o"; done)
  # shellcheck disable=SC2086  # word lists from make
  if gcc $cflags -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT -c src/backend/cpu/backend_cpu.c -o "$d/backend_cpu_renamed.o" &&
    gcc $cflags -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT -c src/backend/cpu/backend_cpu_attention.c \
      -o "$d/backend_cpu_attention_renamed.o" &&
    gcc $cflags -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT -c src/backend/cpu/backend_cpu_rows.c \
      -o "$d/backend_cpu_rows_renamed.o" &&
    gcc $cflags -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT -c src/backend/cpu/backend_cpu_gemma.c \
      -o "$d/backend_cpu_gemma_renamed.o" &&
    gcc $cflags -iquote tests/gpu -I"$CUDA_HOME/include" tests/gpu/check_kernels.c "$d/backend_cpu_renamed.o" \
      "$d/backend_cpu_attention_renamed.o" "$d/backend_cpu_rows_renamed.o" "$d/backend_cpu_gemma_renamed.o" \
      $cuda_objs $objs -o "$d/check_kernels" $ldlibs $cudalibs; then ok build.check_kernels; else
    fail build.check_kernels "compiling or linking tests/gpu/check_kernels.c failed"; fi
  rm -f "$d/backend_cpu_renamed.o" "$d/backend_cpu_attention_renamed.o" "$d/backend_cpu_rows_renamed.o" \
    "$d/backend_cpu_gemma_renamed.o"
  # shellcheck disable=SC2086
  if gcc $cflags tests/gpu/time_kernels.c $cuda_objs $objs -o "$d/time_kernels" $ldlibs $cudalibs; then
    ok build.time_kernels; else fail build.time_kernels "compiling or linking tests/gpu/time_kernels.c failed"; fi
  # shellcheck disable=SC2086
  if gcc $cflags tools/bench/nvme_bench.c $cuda_objs $objs -o "$d/nvme_bench" $ldlibs $cudalibs; then
    ok build.nvme_bench; else fail build.nvme_bench "compiling or linking tools/bench/nvme_bench.c failed"; fi
}

# use_carried: the binaries tools/gpu-bins.sh built (sm_90, portable -march) in
# $BINS, when all four are there and the loader resolves every library of them
# here; bin/shardlm, bin/shardlm-cuda and $WORK's checkers become copies.
use_carried() {
  local f missing
  for f in shardlm shardlm-cuda check_kernels time_kernels; do
    [ -x "$BINS/$f" ] || { say "carried binaries: no $BINS/$f"; return 1; }
  done
  missing=$(for f in shardlm shardlm-cuda check_kernels time_kernels; do ldd "$BINS/$f" 2>&1; done | grep -E 'not found|GLIBC_[0-9.]+.* not found|version .* not found' | sort -u | tr -s ' \t\n' ' ')
  if [ -n "$missing" ]; then
    fail build.carried "the carried binaries in $BINS do not load here: $missing(rebuilding from source)"
    return 1
  fi
  # each trainer copied beside its place and renamed onto it: a process running the old file keeps it, and one
  # starting now gets the old or the new one whole (a rehearsal runs in a checkout whose tests may be running it)
  mkdir -p bin || return 1
  for f in shardlm shardlm-cuda; do
    cp -p "$BINS/$f" "bin/.$f.carried" && mv -f "bin/.$f.carried" "bin/$f" || return 1
  done
  cp -p "$BINS/check_kernels" "$BINS/time_kernels" "$WORK/" || return 1
  [ -x "$BINS/nvme_bench" ] && cp -p "$BINS/nvme_bench" "$WORK/" # optional: the nvme stage skips without it
  say "carried binaries from $BINS: $(tr -s ' \n' ' ' <"$BINS/INFO.json" 2>/dev/null | cut -c1-400)"
  ok build.carried
  PY=${PY:-python3} figure binaries=carried
}

# build_nomake: no make on this machine: build-nomake.sh (tools/gpu-nomake.sh
# wrote it from the Makefile's recipes into gpu-bins/ and gpu-kit/) compiles
# and links the same four programs with gcc and nvcc alone
build_nomake() {
  local s= c
  for c in "${SESSION_NOMAKE:-}" "$BINS/build-nomake.sh" gpu-kit/build-nomake.sh; do
    [ -n "$c" ] && [ -f "$c" ] && { s=$c; break; }
  done
  PY=${PY:-python3} figure binaries=built-here-no-make nomake_script="$s"
  if [ -z "$s" ]; then
    fail build.nomake "no make on this machine, no carried binaries, and no build-nomake.sh in $BINS or gpu-kit/ (tools/gpu-bins.sh and tools/gpu-kit.sh write it)"
    return
  fi
  say "no make here: bash $s (the Makefile's recipes, CUDA for sm_90, warnings not fatal)"
  if KIT=${KIT_ARG#KIT=} NCCL_HOME=${NCCL_HOME:-$WORK/nccl} B=build BIN=bin CHECKERS=$WORK JOBS=$JOBS bash "$s"; then
    ok build.nomake; else fail build.nomake "$s failed (the errors above)"; fi
}

stage_build() {
  if use_carried; then :
  elif command -v make >/dev/null 2>&1; then
    # the fallback: the two trainers only (not the unit tests: time on the GPU
    # machine is short), warnings not fatal (the machine's compiler may be newer)
    PY=${PY:-python3} figure binaries=built-here
    say "make -j$JOBS CUDA=1 WERROR= ${MAKE_ARGS[*]} bin/shardlm bin/shardlm-cuda"
    if make --no-print-directory -j"$JOBS" CUDA=1 WERROR= "${MAKE_ARGS[@]}" bin/shardlm bin/shardlm-cuda; then ok build.make; else
      fail build.make "make CUDA=1 failed (the errors above)"; fi
    link_checkers build "$WORK"
  else
    build_nomake
  fi
  if ldd bin/shardlm-cuda 2>/dev/null | grep -q 'libnccl.*not found'; then
    fail build.nccl_resolves "bin/shardlm-cuda: $(ldd bin/shardlm-cuda | grep 'not found' | tr -s ' \t\n' ' ')"
  elif [ -x bin/shardlm-cuda ]; then ok build.nccl_resolves; fi
  if [ "$EMULATE" = 1 ]; then
    # rebuilt only when a source is newer than its oldest output (the machine is small and shared)
    local oldest=build/cudaemu/time_kernels stale=1
    for f in check_kernels shardlm-cudaemu selftest; do [ build/cudaemu/$f -ot "$oldest" ] && oldest=build/cudaemu/$f; done
    [ -e "$oldest" ] && [ -z "$(find src cuda tests/cudaemu tests/gpu -newer "$oldest" -type f | head -1)" ] &&
      [ -z "$(find bin/shardlm -newer "$oldest" 2>/dev/null)" ] && stale=0
    if [ "$stale" = 0 ]; then say "build/cudaemu is up to date"; ok build.cudaemu
    elif bash tests/cudaemu/build.sh; then ok build.cudaemu; else fail build.cudaemu "tests/cudaemu/build.sh failed"; fi
  fi
}

stage_kernels() {
  local ck=$WORK/check_kernels rc
  [ "$EMULATE" = 1 ] && ck=build/cudaemu/check_kernels
  [ -x "$ck" ] || { echo "@skip no $ck (the build stage failed)"; return 0; }
  timeout -k 5 $((STAGE_LIMIT * 2 / 5)) "$ck" 2>&1 | tee "$WORK/check_kernels.out"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && return 0
  echo "check_kernels: exit $rc"
  # a check_kernels that stopped (an internal error) says why on its last "shardlm:" line
  local why
  why=$(grep '^shardlm:' "$WORK/check_kernels.out" | tail -1)
  [ -n "$why" ] && fail kernels.check_kernels "stopped: $why"
  if [ "$EMULATE" = 1 ] || [ -z "$SANITIZER" ]; then
    skip kernels.memcheck "${SANITIZER:-no compute-sanitizer}${SANITIZER:+ (rehearsal)}"
    return "$rc"
  fi
  # again under memcheck; its lines are prefixed so that they are not counted twice
  # (the first GPU session: "ERROR SUMMARY: 0 errors" after a cuBLAS refusal was reported as memory errors)
  CUDA_LAUNCH_BLOCKING=1 timeout -k 5 $((STAGE_LIMIT / 2)) "$SANITIZER" --tool memcheck "$ck" 2>&1 |
    sed 's/^/memcheck| /' | tee "$WORK/memcheck.out"
  local errors
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$WORK/memcheck.out" | tail -1)
  if [ "$errors" = 0 ]; then ok kernels.memcheck
  else fail kernels.memcheck "compute-sanitizer: ${errors:-no} error summary (memcheck| lines)"; fi
  return "$rc"
}

stage_e2e() {
  local bin=shardlm-cuda
  if [ "$EMULATE" = 1 ]; then
    bin=$ROOT/build/cudaemu/shardlm-cudaemu
    export E2E_SIZE=tiny E2E_CASES=${SESSION_E2E_CASES:-}
  fi
  [ -x "$bin" ] || [ -x "bin/$bin" ] || { echo "@skip no $bin (the build stage failed)"; return 0; }
  # the CPU side precomputed by tools/gpu-bins.sh (used where its config is the case's)
  [ -d "$BINS/refs" ] && export E2E_REFS=$BINS/refs
  E2E_GPU_BIN=$bin E2E_TIMEOUT=$((STAGE_LIMIT / 3)) SHARDLM_COMM_TIMEOUT=60 "$PY" -u tests/gpu/e2e.py
}

stage_throughput() {
  local emu=()
  [ "$EMULATE" = 1 ] && emu=(--emulate)
  SHARDLM_COMM_TIMEOUT=60 "$TORCH_PY" -u tests/gpu/throughput.py "${emu[@]}" --python "$TORCH_PY" \
    --part-timeout $((STAGE_LIMIT * 2 / 5))
}

# the disk of the machine (issue 36's benchmark): where the session's scratch is
# nvme_bench with the stage's arguments and more into $out (its files made and
# removed under $dir); its exit status
nvme_bench_run() {
  mkdir -p "$dir"
  "$nb" --dir "$dir" "${args[@]}" "$@" >"$out" 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}

# the figure "NAME" (ratio, plain, step) of nvme_bench's output $out
nvme_bench_figure() {
  case "$1" in
  ratio) sed -n 's/^ratio plain \/ step: \([0-9.]*\).*/\1/p' "$out" ;;
  plain) sed -n 's/^ *plain read + write *\([0-9.]*\) ms.*/\1/p' "$out" ;;
  step) sed -n 's/^ *nvme AdamW step *\([0-9.]*\) ms.*/\1/p' "$out" ;;
  esac
}

stage_nvme() {
  local nb=$WORK/nvme_bench dir=$WORK/nvme args=(--n 67108864 --rounds 5) out=$WORK/nvme.out
  [ "$EMULATE" = 1 ] && args=(--n 1048576 --piece 262144 --rounds 2)
  [ -x "$nb" ] || { echo "@skip no $nb (the build stage did not link it)"; return 0; }
  mkdir -p "$dir"
  say "disk: $(df -T "$dir" | awk 'NR == 2 {print $1, $2}') at $dir; $(nproc) CPUs"
  nvme_bench_run
  local rc=$? ratio plain step
  cat "$out"
  [ "$rc" = 0 ] || { fail nvme.run "nvme_bench exited $rc"; return 1; }
  ratio=$(nvme_bench_figure ratio) plain=$(nvme_bench_figure plain) step=$(nvme_bench_figure step)
  [ -n "$ratio" ] && [ -n "$plain" ] && [ -n "$step" ] || { fail nvme.run "no ratio in nvme_bench's output"; return 1; }
  PY=${PY:-python3} figure nvme_ratio="$ratio" plain_ms="$plain" step_ms="$step" target=0.8
  ok nvme.run
  # the same bench with more buffers and with smaller and larger pieces (3
  # rounds each): which knob, if any, moves the ratio on this disk (pieces of
  # 8M elements would make the emulation's small state 96 MiB: left out there)
  local v name vargs=()
  for v in "b8:--buffers 8" "p512k:--piece 524288" "p8m:--piece 8388608"; do
    name=${v%%:*}; read -r -a vargs <<<"${v#*:}"
    [ "$EMULATE" = 1 ] && [ "$name" = p8m ] && continue
    nvme_bench_run --rounds 3 "${vargs[@]}"
    rc=$? ratio=$(nvme_bench_figure ratio)
    say "sweep $name (${vargs[*]}): exit $rc, ratio ${ratio:-none}"
    [ -n "$ratio" ] && PY=${PY:-python3} figure "sweep_${name}_ratio=$ratio"
  done
  return 0
}

stage_timings() {
  local tk=$WORK/time_kernels shape=()
  if [ "$EMULATE" = 1 ]; then
    tk=build/cudaemu/time_kernels shape=(--batch 1 --seq 32 --channels 64 --heads 2 --vocab 256 --reps 2)
  fi
  [ -x "$tk" ] || { echo "@skip no $tk (the build stage failed)"; return 0; }
  "$tk" "${shape[@]}" && ok timings.run || fail timings.run "time_kernels exited $?"
  timings_issue45 "$tk"
}

# Issue 45's kernel targets: a Llama-3.1-8B layer's shapes (d 128: 32 heads of 128, 8 KV heads, T 2048, bf16) with
# 8 rows, so that RMSNorm's backward runs at 16384 x 4096: attention_gqa_fwd/bwd (causal; model FLOPs) and
# rmsnorm_bwd (bytes) with cuDNN's attention, then with the tensor-core kernel beside it; figures "issue45_cudnn"
# and "issue45_tc". Emulated: the tiny shape (cuDNN is unavailable there: the log says so, the tc kernel runs).
timings_issue45() {
  local tk=$1 k out shape=(--batch 8 --seq 2048 --channels 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 32000
    --dtype bf16 --reps 5)
  [ "$EMULATE" = 1 ] && shape=(--batch 1 --seq 32 --channels 64 --heads 2 --kv-heads 1 --ffn 128 --vocab 256
    --dtype bf16 --reps 2)
  for k in cudnn tc; do
    out=$WORK/timings_$k.out
    SHARDLM_ATTENTION=$k "$tk" "${shape[@]}" >"$out" 2>&1
    local rc=$?
    sed 's/^@figure {"kernels"/@figure {"issue45_'$k'"/' "$out"
    [ "$rc" = 0 ] && ok "timings.issue45_$k" || fail "timings.issue45_$k" "time_kernels exited $rc"
  done
  if grep -q "cudnn wanted, but" "$WORK/timings_cudnn.out"; then
    skip timings.issue45_cudnn_taken "$(grep -m1 'cudnn wanted, but' "$WORK/timings_cudnn.out" | sed 's/^[^a]*attention: //')"
  else
    ok timings.issue45_cudnn_taken
  fi
  "${PY:-python3}" - "$WORK/timings_cudnn.out" "$WORK/timings_tc.out" <<'PYEOF'
import json, sys
# the targets (issue 45): attention forward >= 400 and backward >= 300 TFLOP/s at d 128 T 2048 causal bf16 in model
# FLOPs (the full T x T square, as time_kernels and the MFU count them; causal_*: the lower triangle computed, the
# count of cudnn-frontend's benchmark tables), RMSNorm backward >= 2.5 TB/s
def ops(path):
    for line in open(path, errors="replace"):
        if line.startswith("@figure "):
            return json.loads(line[8:]).get("kernels", {})
    return {}
got = {}
for side, path in zip(("cudnn", "tc"), sys.argv[1:3]):
    k = ops(path)
    fwd, bwd = (k.get(f"attention_gqa_{d}", {}).get("tflops") for d in ("fwd", "bwd"))
    got[side] = {"attention_fwd_tflops": fwd, "attention_bwd_tflops": bwd,
                 "causal_attention_fwd_tflops": fwd and fwd / 2, "causal_attention_bwd_tflops": bwd and bwd / 2,
                 "rmsnorm_bwd_gbps": k.get("rmsnorm_bwd", {}).get("gbps"),
                 "rmsnorm_bwd_unfused_gbps": k.get("rmsnorm_bwd_unfused", {}).get("gbps"),
                 "layernorm_bwd_gbps": k.get("layernorm_bwd", {}).get("gbps")}
got["targets"] = {"attention_fwd_tflops": 400, "attention_bwd_tflops": 300, "rmsnorm_bwd_gbps": 2500}
print("@figure " + json.dumps({"issue45": got}))
PYEOF
}

# ---- the session -----------------------------------------------------------

EMULATE=${SESSION_EMULATE:-0}
STAGES=$ALL_STAGES
BODY=
while [ $# -gt 0 ]; do
  case $1 in
    --rehearse) EMULATE=1 ;;
    --stages) STAGES=${2//,/ }; shift ;;
    --stages=*) STAGES=${1#--stages=}; STAGES=${STAGES//,/ } ;;
    --stage-body) BODY=$2; shift ;;
    --link-checkers) # BUILD DIR [MAKE ARGS...]: for tools/gpu-bins.sh
      shift; LINK_B=$1 LINK_D=$2; shift 2; MAKE_ARGS=("$@"); CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
      # (not tee /dev/stderr: reopening a stderr that is a file truncates it)
      checks=$(link_checkers "$LINK_B" "$LINK_D") && echo "$checks"
      ! grep -q '^FAIL' <<<"$checks"; exit $? ;;
    -h|--help) usage; exit 0 ;;
    *) echo "session.sh: unknown argument $1; see --help" >&2; exit 2 ;;
  esac
  shift
done
for s in $STAGES; do
  [[ " $ALL_STAGES " == *" $s "* ]] || { echo "session.sh: no stage '$s' (stages: $ALL_STAGES)" >&2; exit 2; }
done

export SESSION_EMULATE=$EMULATE # for the stage bodies
if [ -n "$BODY" ]; then
  # shellcheck disable=SC1091
  [ -f "$WORK/probe.env" ] && . "$WORK/probe.env"
  PY=${PY:-python3} TORCH_PY=${TORCH_PY:-${PY:-python3}} SANITIZER=${SANITIZER:-} GPU_VISIBLE=${GPU_VISIBLE:-0}
  [ -n "${NCCL_REAL:-}" ] && export LD_LIBRARY_PATH=$(dirname "$NCCL_REAL")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -n "${CUDNN_LIB:-}" ] && [ -z "${SHARDLM_CUDNN_LIB:-}" ] && export SHARDLM_CUDNN_LIB=$CUDNN_LIB
  read -r -a MAKE_ARGS <<<"$MAKE_ARGS_STR"
  # a stage that hangs, for tests/t_gpu_session.sh's time-limit check
  [ "${SESSION_INJECT_HANG:-}" = "$BODY" ] && sleep 600
  "stage_$BODY" </dev/null
  exit $?
fi

# The toolkit the nvcc on PATH runs from: nvcc's own _HERE_ (so that a wrapper
# script such as /usr/local/bin/nvcc names its toolkit), else where the link
# leads; a folder without cuda_runtime.h is no toolkit.
nvcc_toolkit() {
  local nv here
  nv=$(command -v nvcc 2>/dev/null) || return 1
  here=$(timeout 20 "$nv" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)
  [ -n "$here" ] || here=$(dirname "$(readlink -f "$nv")")
  [ -x "$here/nvcc" ] && [ -e "$here/../include/cuda_runtime.h" ] && (cd "$here/.." && pwd)
}
# CUDA_HOME: the caller's, else nvcc's toolkit, else /usr/local/cuda, else the
# cuBLAS wheel's folder (libraries only: the build then needs carried binaries)
if [ -z "${CUDA_HOME:-}" ]; then
  if CUDA_HOME=$(nvcc_toolkit); then :
  elif [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda
  else
    for p in ${SESSION_PYTHON:-} /opt/torch/.venv/bin/python /usr/bin/python3 python3; do
      command -v "$p" >/dev/null 2>&1 || continue
      CUDA_HOME=$(timeout 20 "$p" -c 'import nvidia.cublas as m; print(list(m.__path__)[0])' 2>/dev/null) && break
    done
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  fi
fi
export EMULATE CUDA_HOME
# the carried binaries' rpath names this machine's toolkit; the libraries of
# the one found here come first
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset SHARDLM_TF32 # the fp32 checks hold TF32 off
OUT=${OUT:-build/gpu-session}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=${SESSION_WORK:-$ROOT/build/gpu-session-work}
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
export OUT WORK
export SHARDLM_TEST_TMP=$WORK/tmp # the Python scripts' scratch (harness.scratch_dir)
# the carried binaries (tools/gpu-bins.sh) and the kit's unpacked OpenBLAS, outside the kit
export BINS=${SESSION_BINS:-$ROOT/gpu-bins} SHARDLM_KIT_LIBS=${SHARDLM_KIT_LIBS:-$WORK/kit-libs}
rm -rf "$SHARDLM_TEST_TMP" && mkdir -p "$SHARDLM_TEST_TMP"
BUDGET=${SESSION_BUDGET:-540}
export JOBS=$(nproc 2>/dev/null || echo 4)
[ "$EMULATE" = 1 ] && JOBS=2
# the carried kit: MPI, HDF5, jansson, OpenBLAS for a machine that has none
KIT_ARG=
if [ -f gpu-kit/env.sh ]; then
  # shellcheck disable=SC1091
  . gpu-kit/env.sh && KIT_ARG=KIT=gpu-kit
fi
export KIT_ARG
# NCCL_HOME: the probe's link folder (unless the caller named one)
export MAKE_ARGS_STR="CUDA_ARCH=-gencode=arch=compute_90,code=sm_90 NCCL_HOME=${NCCL_HOME:-$WORK/nccl} $KIT_ARG"
for f in session.log results.json metrics.jsonl smi.csv; do rm -f "$OUT/$f"; done
: >"$WORK/stages.tsv"
# Defaults first, so that a probe that hangs or is killed leaves every later
# stage something to run with: the first Python that imports numpy (a quick
# check, no torch), torch's from its usual place.
py0=
for p in ${SESSION_PYTHON:-} /opt/torch/.venv/bin/python /usr/bin/python3 python3; do
  command -v "$p" >/dev/null 2>&1 && timeout 20 "$p" -c 'import numpy' 2>/dev/null && { py0=$(command -v "$p"); break; }
done
tpy0=$py0
[ -x /opt/torch/.venv/bin/python ] && [ -z "${SESSION_PYTHON:-}" ] && tpy0=/opt/torch/.venv/bin/python
printf 'GPU_VISIBLE=0\nNCCL_REAL=\nPY=%q\nTORCH_PY=%q\nSANITIZER=\n' "${py0:-python3}" "${tpy0:-python3}" >"$WORK/probe.env"
# the commit: git's where .git travelled, else what tools/gpu-bins.sh recorded
COMMIT=$(git rev-parse HEAD 2>/dev/null) && ! git diff --quiet HEAD 2>/dev/null && COMMIT="$COMMIT-dirty"
BINS_COMMIT=$(sed -n 's/.*"commit": *"\([^"]*\)".*/\1/p' "$BINS/INFO.json" 2>/dev/null | head -1)
[ -n "$COMMIT" ] || COMMIT=$BINS_COMMIT
# the device tool's .git is the session's first commit: a dirty tree says which commit the binaries are of
case "$COMMIT" in *-dirty) [ -n "$BINS_COMMIT" ] && COMMIT="$COMMIT (gpu-bins built at $BINS_COMMIT)" ;; esac
export COMMIT=${COMMIT:-unknown}
# between stages: GPU processes a stage left behind (its mpirun killed at the
# limit) are listed and killed, so that the next stage has the device
reap_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local pids
  pids=$(timeout 20 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -dc '0-9\n' | sort -u)
  [ -z "$pids" ] && return 0
  log "   leftover GPU processes after $1: $(echo "$pids" | tr '\n' ' ')(killed)"
  for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
  sleep 2
}
# an nvidia-smi trace (SM clock, power, temperature, use, memory), 1 s apart
SMI_PID=
if [ "$EMULATE" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used \
    --format=csv,nounits -lms 1000 >"$OUT/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi
T0=$(date +%s)
log() { echo "$@" | tee -a "$OUT/session.log"; }
log "GPU session $(date -u +%FT%TZ), commit $COMMIT on $(hostname)," \
  "mode $([ "$EMULATE" = 1 ] && echo 'rehearsal (CPU emulation)' || echo gpu), budget ${BUDGET}s, out $OUT"

for s in $ALL_STAGES; do
  if [[ " $STAGES " != *" $s "* ]]; then
    printf '%s\tskip\t0\t0\tnot selected (--stages)\n' "$s" >>"$WORK/stages.tsv"
    continue
  fi
  up=${s^^}
  var=SESSION_LIMIT_$up; limit=${!var:-${LIMIT[$s]}}
  left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -lt 5 ]; then
    printf '%s\tskip\t0\t%s\tthe session budget (%ss) was spent\n' "$s" "$limit" "$BUDGET" >>"$WORK/stages.tsv"
    log "== $s: skipped, the session budget is spent"
    continue
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "== $s (limit ${limit}s) =="
  t_start=$(date +%s.%N)
  STAGE_LIMIT=$limit timeout -k 10 "$limit" bash "$SELF" --stage-body "$s" >"$WORK/$s.log" 2>&1
  rc=$?
  reap_gpu "$s"
  secs=$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  cat "$WORK/$s.log" >>"$OUT/session.log"
  n_ok=$(grep -c '^ok ' "$WORK/$s.log") n_fail=$(grep -c '^FAIL ' "$WORK/$s.log") n_skip=$(grep -c '^skip ' "$WORK/$s.log")
  note=
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=timeout note="killed after ${limit}s"
  elif grep -q '^@skip ' "$WORK/$s.log"; then status=skip note=$(sed -n 's/^@skip //p' "$WORK/$s.log" | head -1)
  elif [ "$n_fail" -gt 0 ]; then status=fail
  elif [ "$rc" != 0 ]; then status=fail note="exit status $rc"
  elif [ "$n_ok" = 0 ]; then status=fail note="no check passed"
  else status=pass
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$s" "$status" "$secs" "$limit" "$note" >>"$WORK/stages.tsv"
  grep -E '^(FAIL|skip) ' "$WORK/$s.log" | head -20 | sed 's/^/   /' | tee -a "$OUT/session.log"
  log "== $s: $status in ${secs}s ($n_ok ok, $n_fail failed, $n_skip skipped)${note:+: $note}"
done

# results.json from the stage table and the logs (any python3: json only)
# shellcheck disable=SC1091
[ -f "$WORK/probe.env" ] && . "$WORK/probe.env"
RPY=
for p in ${PY:-} ${SESSION_PYTHON:-} /opt/torch/.venv/bin/python /usr/bin/python3 python3; do
  command -v "$p" >/dev/null 2>&1 && { RPY=$p; break; }
done
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null && wait "$SMI_PID" 2>/dev/null
"$RPY" - "$WORK/stages.tsv" "$OUT" "$EMULATE" "$BUDGET" "$(($(date +%s) - T0))" "$WORK" "$COMMIT" "$BINS" \
  <<'EOF' | tee -a "$OUT/session.log"
import csv, glob, json, os, statistics, sys
tsv, out, emulate, budget, total = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
work, commit, bins = sys.argv[6], sys.argv[7], sys.argv[8]
stages = []
for line in open(tsv):
    name, status, secs, limit, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    st = {"name": name, "status": status, "seconds": float(secs), "limit_s": int(limit), "note": note,
          "log": None, "passed": 0, "failed": 0, "failed_checks": [], "skipped": [], "figures": {}}
    log = os.path.join(work, name + ".log")
    if os.path.exists(log):
        st["log"] = "session.log"  # each stage's log is copied into it, under "== NAME"
        for row in open(log, errors="replace"):
            row = row.rstrip("\n")
            if row.startswith("ok "):
                st["passed"] += 1
            elif row.startswith("FAIL "):
                st["failed"] += 1
                st["failed_checks"].append(row[5:][:300])
            elif row.startswith("skip "):
                n, _, why = row[5:].partition(": ")
                st["skipped"].append({"name": n, "status": "skip", "reason": why})
            elif row.startswith("@figure "):
                try:
                    st["figures"].update(json.loads(row[8:]))
                except ValueError as e:
                    st["figures"].setdefault("unreadable", []).append(f"{e}: {row[8:200]}")
    if emulate:
        st["figures"]["emulated"] = True
    stages.append(st)
by = {s["name"]: s for s in stages}
probe = by.get("probe", {}).get("figures", {})
try:
    carried = json.load(open(os.path.join(bins, "INFO.json")))
except (OSError, ValueError):
    carried = None
# the nvidia-smi trace: SM clock and power over the session (medians, not means)
clocks = {"source": None, "reason": "no nvidia-smi trace (no GPU, or the rehearsal)"}
try:
    rows = [r for r in csv.reader(open(os.path.join(out, "smi.csv"))) if r and not r[0].startswith("timestamp")]
    def col(i):
        v = []
        for r in rows:
            try:
                v.append(float(r[i]))
            except (ValueError, IndexError):
                pass
        return v
    sm, pw = col(1), col(3)
    if sm:
        clocks = {"source": "smi.csv", "samples": len(sm), "sm_mhz_median": statistics.median(sm),
                  "sm_mhz_min": min(sm), "sm_mhz_max": max(sm),
                  "power_w_median": statistics.median(pw) if pw else None, "power_w_max": max(pw) if pw else None}
except OSError:
    pass
# every training run's metrics, one JSONL, each row naming its run (within 16 MiB)
n_rows, size = 0, 0
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for path in sorted(glob.glob(os.path.join(work, "tmp", "**", "*.jsonl"), recursive=True)):
        run = os.path.relpath(path, os.path.join(work, "tmp"))
        for line in open(path, errors="replace"):
            try:
                row = dict(json.loads(line), run=run)
            except ValueError:
                continue
            text = json.dumps(row) + "\n"
            if size + len(text) > 15 << 20:
                break
            f.write(text)
            size += len(text)
            n_rows += 1
res = {"mode": "rehearsal" if emulate else "gpu", "commit": commit, "budget_s": budget, "seconds": total,
       "machine": {k: None if probe.get(k) is None else str(probe[k])  # versions as written ("2.36", "13.0")
                   for k in ("gpu", "glibc", "os", "gcc", "make", "nvcc", "cuda_home")},
       "binaries": {"source": by.get("build", {}).get("figures", {}).get("binaries"),
                    "carried": carried},
       "clocks": clocks, "metrics_rows": n_rows,
       "nccl_bus_bandwidth": "not measured: it needs more than one GPU (one is lent); N = 2 on one GPU runs "
                             "through the host-staged MPI path, NCCL at N = 1 is a load-and-run check",
       "passed": sum(s["status"] == "pass" for s in stages),
       "failed": sum(s["status"] in ("fail", "timeout") for s in stages),
       "skipped": sum(s["status"] == "skip" for s in stages), "stages": stages}
with open(os.path.join(out, "results.json.tmp"), "w") as f:
    json.dump(res, f, indent=1)
os.replace(os.path.join(out, "results.json.tmp"), os.path.join(out, "results.json"))
print(f"\n| stage | status | seconds | limit | checks ok/failed | note |\n|---|---|---|---|---|---|")
for s in stages:
    print(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s['limit_s']} | {s['passed']}/{s['failed']} | "
          f"{s['note'] or '; '.join(x['name'] + ' skipped: ' + x['reason'] for x in s['skipped'])[:120]} |")
print(f"{res['skipped']} skipped")
print(f"{res['passed']} passed, {res['failed']} failed")
EOF
[ -f "$OUT/results.json" ] || { log "results.json was not written (no python3?)"; log "0 passed, 1 failed"; exit 1; }
tail -1 "$OUT/session.log" | grep -q ' 0 failed$'
