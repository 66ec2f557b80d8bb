#!/usr/bin/env bash
# The default job of `make run`: a small GPT-2 trained on the CPU by 2 MPI
# ranks at ZeRO stage 3, on the project's own sources, with the memory table,
# the traffic per step and a text sample at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/make_corpus.sh
ranks=${SHARDLM_RANKS:-2}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# one core per rank: OpenMP and OpenBLAS threads share it (DESIGN §11)
cores=$(nproc)
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
exec mpirun -np "$ranks" --oversubscribe --bind-to none bin/shardlm train input/default.json "$@"
