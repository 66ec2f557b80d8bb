#!/usr/bin/env bash
# The real CUDA sources (src/backend/cuda/*.cu) run on the CPU under tests/cudaemu's
# emulation of the CUDA runtime, cuBLAS(Lt) and NCCL: builds them
# (tests/cudaemu/build.sh), runs tests/gpu/check_kernels (its own ok/FAIL
# lines: every kernel against the CPU backend in fp32, bf16 and fp16), the
# emulation's self-checks (bad launches, divergent barriers and bad cuBLAS
# arguments are caught), and end-to-end training, emulated CUDA build
# against CPU build (tests/cudaemu/e2e.py). Streams are lazy (a missing
# synchronisation changes results; CUDAEMU_EAGER=1 runs each call at once).
# No GPU, no nvcc needed: g++ only.
set -u
cd "$(dirname "$0")/.."
ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# make test-asan: the emulated CUDA code under AddressSanitizer too (a kernel
# that reads or writes outside its cudaMalloc block faults)
[ "${BUILD:-build}" = build-asan ] && export CUDAEMU_ASAN=1
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/t_cudaemu.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if bash tests/cudaemu/build.sh >"$TMP/build.log" 2>&1; then
  ok cudaemu.build
else
  fail cudaemu.build "$(grep -v '^rewrite' "$TMP/build.log" | tail -4 | tr '\n' ' ')"
  exit 1
fi
env -u SHARDLM_TF32 timeout 300 build/cudaemu/check_kernels >"$TMP/ck.out" 2>"$TMP/ck.err"
rc=$?
grep -E '^(ok|FAIL) ' "$TMP/ck.out"
summary=$(tail -1 "$TMP/ck.out")
if [ "$rc" -eq 0 ] && [[ "$summary" =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
  ok cudaemu.check_kernels_completed
else
  fail cudaemu.check_kernels_completed "exit $rc, last line '$summary', stderr: $(tail -3 "$TMP/ck.err" | tr '\n' ' ')"
fi
# again with cuBLASLt finding no algorithm for any epilogue: every fused matmul takes its unfused fallback
env -u SHARDLM_TF32 CUDAEMU_LT_REFUSE=all timeout 300 build/cudaemu/check_kernels >"$TMP/ck_refuse.out" 2>&1
rc=$?
summary=$(tail -1 "$TMP/ck_refuse.out")
if [ "$rc" -eq 0 ] && [[ "$summary" =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
  ok cudaemu.check_kernels_cublaslt_refused
else
  fail cudaemu.check_kernels_cublaslt_refused "exit $rc: $(grep -m3 '^FAIL' "$TMP/ck_refuse.out" | tr '\n' ' ') $summary"
fi
# again with cuBLASLt answering INVALID_VALUE for the bias epilogues, as cuBLAS 13 on an H200 did in bf16:
# the unfused kernels run, and the note says so once per epilogue
env -u SHARDLM_TF32 CUDAEMU_LT_REFUSE=invalid timeout 300 build/cudaemu/check_kernels >"$TMP/ck_invalid.out" 2>&1
rc=$?
summary=$(tail -1 "$TMP/ck_invalid.out")
notes=$(grep -c "cuBLASLt refused the fused epilogue" "$TMP/ck_invalid.out")
if [ "$rc" -eq 0 ] && [[ "$summary" =~ ^[0-9]+\ passed,\ 0\ failed$ ]] && [ "$notes" -ge 1 ] && [ "$notes" -le 3 ]; then
  ok cudaemu.check_kernels_cublaslt_invalid_value
else
  fail cudaemu.check_kernels_cublaslt_invalid_value "exit $rc, $notes notes: $(grep -m3 '^FAIL' "$TMP/ck_invalid.out" | tr '\n' ' ') $summary"
fi
# the emulation catches what it is there to catch
for mode in $(build/cudaemu/selftest --list); do
  rc=$(bash -c 'ulimit -c 0; "$@" >"$0" 2>&1; echo $?' "$TMP/self.out" build/cudaemu/selftest "$mode" 2>/dev/null)
  want=$(build/cudaemu/selftest --expect "$mode")
  if [ "$want" = pass ]; then
    [ "$rc" -eq 0 ] && ok "cudaemu.self.$mode" || fail "cudaemu.self.$mode" "exit $rc: $(tail -2 "$TMP/self.out" | tr '\n' ' ')"
  else
    [ "$rc" -ne 0 ] && grep -q -- "$want" "$TMP/self.out" && ok "cudaemu.self.$mode" ||
      fail "cudaemu.self.$mode" "exit $rc, want a failure saying '$want', got: $(tail -2 "$TMP/self.out" | tr '\n' ' ')"
  fi
done
/usr/bin/python3 tests/cudaemu/e2e.py
