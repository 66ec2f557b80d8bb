# shellcheck shell=bash
# jobs/lib.sh — what every shardlm batch script does; sourced by the *.sbatch
# scripts next to it, which only state their allocation (#SBATCH lines) and
# the binary. Not run on its own.
#
# shardlm_job BIN CONFIG [TRAIN_OPTIONS...]
#   1. prints the allocation (job, restart count, nodes, tasks, CPUs, GPUs,
#      time limit) into the job's log;
#   2. starts one rank per task with srun (--mpi=pmix, SHARDLM_SRUN_MPI
#      overrides): `BIN train CONFIG --resume auto --print-config OPTIONS`.
#      The ranks learn rank, local rank and world size from PMIx; nothing here
#      counts GPUs or tasks: srun starts what the allocation holds. The trainer
#      logs the resolved config, the memory plan and, on a restart, the
#      checkpoint it resumed from;
#   3. acts on the trainer's exit status:
#        0  done                                   -> exit 0
#        3  stopped by SIGUSR1/SIGTERM, checkpoint saved
#                                                  -> scontrol requeue, exit 3
#        2  bad input (config, data, checkpoint)   -> exit 2, not requeued
#        *  anything else                          -> that status, not requeued
#
# Preemption: the scripts ask for `--signal=USR1@SECONDS` (no "B:"), so Slurm
# signals the job step, i.e. every rank srun started, SECONDS before the time
# limit; the batch shell itself is not signalled and needs no trap. The ranks
# finish the step, agree, save and exit 3; srun returns 3. Slurm does not
# requeue a job for its exit status, so this script does it: `scontrol
# requeue` puts the job back in the queue under the same id (with
# --open-mode=append the log keeps both runs), and the next run's
# `--resume auto` continues from checkpoint.dir's latest checkpoint (a first
# run finds none and starts fresh). SLURM_RESTART_COUNT counts the runs.
#
# Environment: SHARDLM_HOME (the shardlm checkout; default the directory sbatch
# was called from), SHARDLM_BIN (overrides the script's binary),
# SHARDLM_SRUN_MPI (srun's --mpi plugin, default pmix). OMP_NUM_THREADS
# defaults to the task's CPUs (--cpus-per-task).

shardlm_log() { echo "== $(date '+%F %T') | $*"; }

shardlm_print_allocation() {
  local limit
  limit=$(squeue -h -j "$SLURM_JOB_ID" -o %l 2>/dev/null) || limit=unknown
  shardlm_log "allocation"
  echo "job          $SLURM_JOB_ID ($SLURM_JOB_NAME), run $((${SLURM_RESTART_COUNT:-0} + 1)) (restart count ${SLURM_RESTART_COUNT:-0})"
  echo "partition    ${SLURM_JOB_PARTITION:-?}, time limit $limit"
  echo "nodes        ${SLURM_JOB_NUM_NODES:-?}: ${SLURM_JOB_NODELIST:-?}"
  echo "tasks        ${SLURM_NTASKS:-?} (per node: ${SLURM_TASKS_PER_NODE:-?}), CPUs per task ${SLURM_CPUS_PER_TASK:-1}"
  echo "GPUs         per node: ${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-none}}${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}"
  echo "batch host   $(hostname -s), working directory $PWD"
  echo "binary       $1"
}

# shardlm_requeue JOBID: scontrol requeue, tried 5 times 5 s apart
# (SHARDLM_REQUEUE_PAUSE seconds), since a busy slurmctld may not answer the
# first time (the checkpoint is saved; a lost requeue would leave the job
# finished and the run stopped).
shardlm_requeue() {
  local try pause=${SHARDLM_REQUEUE_PAUSE:-5}
  for try in 1 2 3 4 5; do
    scontrol requeue "$1" && return 0
    if [ "$try" -lt 5 ]; then
      shardlm_log "scontrol requeue $1 failed (try $try of 5); again in $pause s"
      sleep "$pause"
    fi
  done
  return 1
}

shardlm_job() {
  local bin=$1 status
  shift
  if [ $# -lt 1 ]; then
    echo "shardlm job: error: no config given; submit as: sbatch $0 CONFIG [train options]" >&2
    exit 2
  fi
  if [ ! -x "$bin" ]; then
    echo "shardlm job: error: $bin is not an executable; build it (make) or set SHARDLM_HOME/SHARDLM_BIN" >&2
    exit 2
  fi
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  shardlm_print_allocation "$bin"
  shardlm_log "srun $bin train $*"
  srun --mpi="${SHARDLM_SRUN_MPI:-pmix}" \
    "$bin" train "$1" --resume auto --print-config "${@:2}"
  status=$?
  case $status in
    0) shardlm_log "training done" ;;
    3)
      shardlm_log "stopped early with a checkpoint (exit status 3): requeueing job $SLURM_JOB_ID"
      shardlm_requeue "$SLURM_JOB_ID" ||
        shardlm_log "scontrol requeue failed 5 times: resubmit the job by hand, it resumes"
      ;;
    2) shardlm_log "bad input (exit status 2): not requeued; fix the config or data named above" ;;
    *) shardlm_log "failed (exit status $status): not requeued" ;;
  esac
  exit "$status"
}
