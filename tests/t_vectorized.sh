#!/usr/bin/env bash
# t_vectorized — the CPU backend's elementwise kernels compile to SIMD code on
# every x86-64 level the project runs on, not only on the machine at hand.
#
# On an AVX2-only Zen 3 the GELU loops once compiled to scalar code (17% of a
# training step) although they vectorised on AVX-512 machines: GCC had turned
# the exp clamp into branches, and under -ftrapping-math only AVX-512's masked
# operations may execute them speculatively (see the Makefile's
# -fno-trapping-math). This test builds src/backend/cpu/backend_cpu.o and
# src/backend/cpu/backend_cpu_attention.o with the Makefile's own flags for each target
# below (compiling only: no target CPU is needed)
# and reads the disassembly of each hot loop's OpenMP body: it must hold
# packed single-precision FMAs (the exp polynomial alone has 7 per vector),
# and the softmax loops a packed max (their max reduction). SwiGLU (Llama)
# calls the same exp.
#
#   zen3       -march=x86-64-v3 -mtune=znver3 (what -march=native means on a Zen 3)
#   haswell    -march=haswell
#   avx512     -march=skylake-avx512
#   native     this machine's -march=native (the default build)
set -u
cd "$(dirname "$0")/.."
mkdir -p build/vectorized

MIN_PACKED_FMA=7   # the degree-7 polynomial of fast_expf (src/core/fastmath.h)
# OBJECT:FUNCTION[+HELPER...], the object under src/; a kernel's code is its function's with the static helpers
# it calls, where the compiler keeps them out of line (it inlines them for some targets and not for others).
# f32_X is the fp32 kernel of backend_X (backend_cpu.c's entry points dispatch to it); its checks keep
# backend_X's name.
# Attention: the materialized kernel's softmax, the tiled kernel's online softmax (forward) and its
# recomputed probabilities (backward).
KERNELS="backend_cpu:f32_gelu_forward._omp_fn.0 backend_cpu:f32_gelu_backward._omp_fn.0
backend_cpu:f32_crossentropy_forward._omp_fn.0 backend_cpu_attention:materialized_forward._omp_fn.0
backend_cpu_attention:tiled_forward._omp_fn.0+tiled_forward_rows+tiled_forward_step+tiled_softmax_row
backend_cpu_attention:tiled_backward._omp_fn.0+tiled_backward_kv_head+tiled_backward_tile
backend_cpu:f32_swiglu_forward._omp_fn.0 backend_cpu:f32_swiglu_backward._omp_fn.0"
NEEDS_MAX="f32_crossentropy_forward._omp_fn.0 materialized_forward._omp_fn.0 tiled_forward._omp_fn.0"
status=0

check() {   # NAME CONDITION-STATUS DETAILS
  if [ "$2" -eq 0 ]; then echo "ok $1"; else echo "FAIL $1: $3"; status=1; fi
}

body() {    # OBJECT FUNCTION: the function's disassembly
  objdump -d --no-show-raw-insn "$1" | awk -v f="<$2>:" '$2 == f { p = 1; next } /^$/ { p = 0 } p'
}

for target in zen3 haswell avx512 native; do
  case $target in
    zen3) march="-march=x86-64-v3 -mtune=znver3" ;;
    haswell) march="-march=haswell" ;;
    avx512) march="-march=skylake-avx512" ;;
    native) march="-march=native" ;;
  esac
  build=build/vectorized/$target
  if ! make --no-print-directory -s OPT="-O3 $march" BUILD="$build" "$build/src/backend/cpu/backend_cpu.o" \
    "$build/src/backend/cpu/backend_cpu_attention.o" >"$build.log" 2>&1; then
    check "vectorized.$target.builds" 1 "$(tail -5 "$build.log")"
    continue
  fi
  for kernel in $KERNELS; do
    obj=$build/src/backend/cpu/${kernel%%:*}.o fns=${kernel#*:} fn=${fns%%+*} code=''
    for f in ${fns//+/ }; do code+=$(body "$obj" "$f")$'\n'; done
    name=${fn%._omp_fn.0} && name=vectorized.$target.${name/#f32_/backend_}
    if [ -z "$code" ]; then
      check "$name" 1 "no function $fn in $obj"
      continue
    fi
    fma=$(grep -cE 'v(fn?madd|fn?msub)[0-9]+ps' <<<"$code")
    scalar=$(grep -cE 'v(fn?madd|fn?msub)[0-9]+ss' <<<"$code")
    check "$name.packed_fma" $((fma < MIN_PACKED_FMA)) \
      "$fma packed FMAs (want >= $MIN_PACKED_FMA), $scalar scalar ones: the loop stayed scalar for $march"
    if [[ " $NEEDS_MAX " == *" $fn "* ]]; then
      max=$(grep -cE 'vmaxps' <<<"$code")
      check "$name.packed_max" $((max == 0)) "no vmaxps: the softmax's max reduction is scalar for $march"
    fi
  done
done
exit $status
