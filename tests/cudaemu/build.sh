#!/usr/bin/env bash
# Builds the CUDA sources against the CPU emulation of the CUDA runtime,
# cuBLAS, cuBLASLt and NCCL (tests/cudaemu/README.md), into build/cudaemu/:
#   check_kernels     tests/gpu/check_kernels.c + the emulated CUDA backend +
#                     the CPU backend renamed cpu_* (linked as tests/gpu/session.sh does)
#   time_kernels      tests/gpu/time_kernels.c + the emulated CUDA backend
#                     (timings meaningless: it rehearses tests/gpu/session.sh)
#   shardlm-cudaemu   the trainer: build/src/**/*.o but the CPU backend (the
#                     Makefile's CUDA_HOST_OBJS) + the emulated src/backend/cuda/*.cu
# Reuses the objects of the normal CPU build (runs `make bin/shardlm` first).
# Set CUDAEMU_ASAN=1 for an AddressSanitizer build of the emulated code
# (out-of-bounds kernel accesses to cudaMalloc memory then fault).
set -eu
cd "$(dirname "$0")/../.."
OUT=build/cudaemu
mkdir -p "$OUT"
make --no-print-directory bin/shardlm >"$OUT/make.log" 2>&1 || { tail -20 "$OUT/make.log"; exit 1; }
PC="ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc liburing nettle"
PC_CFLAGS=$(pkg-config --cflags $PC)
PC_LIBS=$(pkg-config --libs $PC)
SAN=""
[ "${CUDAEMU_ASAN:-0}" = 1 ] && SAN="-fsanitize=address -fno-omit-frame-pointer"
# -Wno-unknown-pragmas: nvcc's "#pragma unroll" (an unrolling hint; g++ spells it "#pragma GCC unroll")
CXXFLAGS="-std=c++17 -O2 -g $SAN -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-unknown-pragmas -DOMPI_SKIP_MPICXX=1 -iquote src -iquote src/backend/cuda -I tests/cudaemu/include $PC_CFLAGS"
pids=()
# the emulation itself
# (the fiber scheduler is never instrumented: ASan cannot follow its stack switches)
g++ ${CXXFLAGS/$SAN/} -c tests/cudaemu/cudaemu.cc -o "$OUT/cudaemu.o" & pids+=($!)
for f in cublas cublaslt nccl_mpi; do
  g++ $CXXFLAGS -c "tests/cudaemu/$f.cc" -o "$OUT/$f.o" & pids+=($!)
done
# the real CUDA sources (every src/backend/cuda/*.cu, as the Makefile's CUDA_SRCS), launches rewritten
cuda_objs=()
for src in src/backend/cuda/*.cu; do
  f=$(basename "$src" .cu)
  python3 tests/cudaemu/rewrite_launches.py "$src" "$OUT/$f.cc"
  g++ $CXXFLAGS -x c++ -c "$OUT/$f.cc" -o "$OUT/$f.o" & pids+=($!)
  cuda_objs+=("$OUT/$f.o")
done
# the CPU backend renamed cpu_*, and the kernel checker, as tests/gpu/session.sh builds them
for f in backend_cpu backend_cpu_attention backend_cpu_rows backend_cpu_gemma; do
  gcc -std=gnu11 -O2 -march=native -fopenmp -iquote src -include tests/gpu/cpu_names.h -DBACKEND_CPU_NO_ACT $PC_CFLAGS \
    -c "src/backend/cpu/$f.c" -o "$OUT/${f}_renamed.o" & pids+=($!)
done
gcc -std=gnu11 -O2 -fopenmp -Wall -Wextra -Werror -iquote src -iquote tests/gpu -I tests/cudaemu/include $PC_CFLAGS \
  -c tests/gpu/check_kernels.c -o "$OUT/check_kernels.o" & pids+=($!)
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -iquote src $PC_CFLAGS \
  -c tests/gpu/time_kernels.c -o "$OUT/time_kernels.o" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
# the objects of today's sources in build/src (never a stale one of a moved or deleted source)
src_objs() { find src -name '*.c' | sort | sed 's#^src/\(.*\)\.c$#build/src/\1.o#'; }
EMU="$OUT/cudaemu.o $OUT/cublas.o $OUT/cublaslt.o $OUT/nccl_mpi.o ${cuda_objs[*]}"
g++ $SAN -fopenmp "$OUT/check_kernels.o" "$OUT/backend_cpu_renamed.o" "$OUT/backend_cpu_attention_renamed.o" \
  "$OUT/backend_cpu_rows_renamed.o" "$OUT/backend_cpu_gemma_renamed.o" $EMU \
  $(src_objs | grep -v -e '/main.o$' -e '/backend_cpu') -o "$OUT/check_kernels" $PC_LIBS -lm
g++ $SAN -fopenmp "$OUT/time_kernels.o" $EMU \
  $(src_objs | grep -v -e '/main.o$' -e '/backend_cpu') -o "$OUT/time_kernels" $PC_LIBS -lm
g++ $SAN -fopenmp $(src_objs | grep -v '/backend/cpu/') \
  $EMU -o "$OUT/shardlm-cudaemu" $PC_LIBS -lm

g++ $CXXFLAGS tests/cudaemu/selftest.cc "$OUT/cudaemu.o" "$OUT/cublas.o" "$OUT/cublaslt.o" "$OUT/nccl_mpi.o" -o "$OUT/selftest" $PC_LIBS
echo "built $OUT/check_kernels $OUT/time_kernels $OUT/shardlm-cudaemu $OUT/selftest"
