#!/bin/bash
# Interactive runs with srun, from a login node (srun makes the allocation)
# or inside one made by salloc:
#
#   jobs/srun.sh --ntasks=2 -- input/default.json --set train.steps=50
#   salloc --nodes=1 --ntasks-per-node=8 --gpus-per-node=8
#   SHARDLM_BIN=bin/shardlm-cuda jobs/srun.sh -- CONFIG --resume auto
#
# Options before "--" go to srun, the rest to `shardlm train`. The output
# comes to the terminal; Ctrl-C twice within a second makes srun end the
# ranks (once only prints their state). Nothing is requeued: a run stopped by
# SIGUSR1 (`scancel -s USR1 JOBID`) exits 3 with a checkpoint, and running the
# same line again with --resume auto continues it.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${SHARDLM_BIN:-$HERE/../bin/shardlm}
srun_opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  srun_opts+=("$1")
  shift
done
[ "${1:-}" = -- ] && shift
if [ $# -lt 1 ]; then
  echo "usage: $0 [SRUN_OPTIONS...] -- CONFIG [TRAIN_OPTIONS...]" >&2
  exit 2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
exec srun --mpi="${SHARDLM_SRUN_MPI:-pmix}" "${srun_opts[@]}" \
  "$BIN" train "$@" --print-config
