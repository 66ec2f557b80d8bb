#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU (issue 6). In one run:
#   1. builds the CUDA backend (make CUDA=1) and tests/gpu/check_kernels;
#   2. checks every CUDA kernel against the CPU backend on fresh random
#      inputs, with activations in fp32 (TF32 off: relative error <= 1e-5),
#      bf16 (<= 1e-2) and fp16 (<= 5e-3); casts bit for bit;
#      outputs poisoned with NaN before each kernel so unwritten elements fail);
#   3. end-to-end training, CUDA build against CPU build (tests/gpu/e2e.py):
#      N=1 over NCCL and N=2 on one GPU over host-staged MPI, fp32 and bf16;
#   4. the tokens/s, MFU and peak-memory table for GPT-2 124M and 350M in
#      bf16, with PyTorch on the same GPU as the reference (needs torch with
#      CUDA; the table says n/a without it).
# Ends with "N passed, N failed" (both steps' counts together).
set -u
cd "$(dirname "$0")/../.."
unset SHARDLM_TF32 # the fp32 checks hold TF32 off
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
# KIT=gpu-kit (after sourcing gpu-kit/env.sh): dependencies from the kit of
# tools/gpu-kit.sh, for a machine without the packages or pkg-config.
KIT=${KIT:-}
make CUDA=1 ${KIT:+KIT="$KIT"} all >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "0 passed, 1 failed"; exit 1; }
if [ -n "$KIT" ]; then
  PC_CFLAGS="-I$KIT/include"
  PC_LIBS="-L$KIT/lib -Wl,-rpath-link,$KIT/lib -lhdf5 -lmpi -lopenblas -ljansson"
else
  PC_CFLAGS=$(pkg-config --cflags ompi hdf5-openmpi openblas jansson)
  PC_LIBS=$(pkg-config --libs ompi hdf5-openmpi openblas jansson)
fi
# The CPU backend again, its functions renamed cpu_*, beside the CUDA one.
gcc -std=gnu11 -O2 -march=native -fopenmp -iquote src -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT $PC_CFLAGS \
  -c src/backend_cpu.c -o "$OUT/backend_cpu_renamed.o" &&
gcc -std=gnu11 -O2 -fopenmp -Wall -Wextra -Werror -iquote src -iquote tests/gpu -I"$CUDA_HOME/include" $PC_CFLAGS \
  tests/gpu/check_kernels.c "$OUT/backend_cpu_renamed.o" build/cuda/*.o \
  $(ls build/src/*.o | grep -v -e '/main.o$' -e '/backend_cpu' ) \
  -o "$OUT/check_kernels" $PC_LIBS -L"$CUDA_HOME/lib64" -lcublas -lcudart -lnccl -lstdc++ -lm \
  -Wl,-rpath,"$CUDA_HOME/lib64" || { echo "FAIL build_check_kernels"; echo "0 passed, 1 failed"; exit 1; }
if [ "${1:-}" = "--build-only" ]; then
  echo "built $OUT/check_kernels"
  exit 0
fi
"$OUT/check_kernels" | tee "$OUT/kernels.log"
# Debian's interpreter has numpy (the python3 first on PATH may not); PYTHON overrides
PY=${PYTHON:-/usr/bin/python3}
"$PY" -u tests/gpu/e2e.py | tee "$OUT/e2e.log"
# a step that crashed before its summary line counts as one failure
count() { tail -1 "$1" | sed -n "s/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p" | grep . || echo "0 1"; }
read -r kp kf < <(count "$OUT/kernels.log")
read -r ep ef < <(count "$OUT/e2e.log")
echo "$((kp + ep)) passed, $((kf + ef)) failed"
[ "$((kf + ef))" -eq 0 ]
