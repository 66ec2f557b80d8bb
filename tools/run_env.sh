# shellcheck shell=bash
# Sourced by tools/run_default.sh (make run-tiny) and tools/run_real.sh (make
# run), with $ranks set: how the job's ranks run on this machine, and the two
# helpers that print what runs. Sets mpi (the mpirun command line), shardlm
# (the binary: SHARDLM_BIN, else bin/shardlm), section and show.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# one core per rank: OpenMP and OpenBLAS threads share it
cores=$(nproc)
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# Debian's OpenBLAS falls back to its generic kernels on CPUs newer than it;
# the best kernels this CPU's flags allow (tools/bench/coretype.py) run the
# pre-training 2-3 times faster. An OPENBLAS_CORETYPE already set is kept;
# on CPUs the module does not know (not x86-64) OpenBLAS chooses.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(python3 -c 'import sys; sys.path.insert(0, "tools/bench"); import coretype
print(coretype.resolve("auto") or "")' 2>/dev/null) || core=""
  if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
fi
mpi=(mpirun -np "$ranks" --oversubscribe --bind-to none)
shardlm=${SHARDLM_BIN:-bin/shardlm}
section() { printf '\n== %s\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }
