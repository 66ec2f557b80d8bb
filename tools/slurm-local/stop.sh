#!/usr/bin/env bash
# Stops the local Slurm cluster that start.sh started: cancels every job,
# kills what a job leaves behind, then stops slurmd, slurmctld and munged.
# Only processes named in the cluster's own pid files are signalled. Logs and
# state stay in SHARDLM_SLURM_DIR (start.sh wipes them on the next start).
set -uo pipefail
# shellcheck source=tools/slurm-local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ "$(id -u)" = 0 ] || die "run as root"

if is_running "$PID_DIR/slurmctld.pid" slurmctld; then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u)
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086  # one id per word
    timeout 10 scancel $jobs 2>/dev/null
    for ((i = 0; i < 100; i++)); do
      [ -z "$(timeout 10 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.1
    done
    # A job that ignores SIGTERM would live on for KillWait (30 s).
    for id in $jobs; do
      timeout 10 scontrol listpids "$id" 2>/dev/null |
        awk -v id="$id" '$2 == id && $1 ~ /^[0-9]+$/ { print $1 }' |
        xargs -r kill -KILL 2>/dev/null
    done
  fi
fi
stop_daemon "$PID_DIR/slurmd.pid" slurmd
stop_daemon "$PID_DIR/slurmctld.pid" slurmctld
stop_daemon "$PID_DIR/munged.pid" munged
say "stopped"
