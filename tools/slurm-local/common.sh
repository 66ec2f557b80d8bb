# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings are used by the scripts that source this
# Sourced by start.sh and stop.sh: where the local cluster keeps its files,
# and the few process helpers both need. Nothing here is run on its own.
#
# Everything the cluster writes lives under SHARDLM_SLURM_DIR, except
# slurm.conf, which goes to /etc/slurm (Slurm's default place, so
# sbatch, srun, scontrol and the job steps find them without SLURM_CONF) and
# the munge key and socket (/etc/munge, /run/munge), which the munge client
# library looks for there.

# Default: a directory on /dev/shm when that is a writable tmpfs. slurmctld
# fsyncs its state files and writes its log under locks that every client
# call waits for; on a disk that other work keeps busy (a test writing
# checkpoints) that stalled scontrol and scancel for 20 s and more ("Unexpected
# missing socket error"). On tmpfs nothing waits for the disk.
default_slurm_dir() {
  if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
    echo /dev/shm/shardlm-slurm
  else
    echo /tmp/shardlm-slurm
  fi
}
SLURM_DIR=${SHARDLM_SLURM_DIR:-$(default_slurm_dir)}
SLURM_ETC=/etc/slurm
SLURM_CONF_FILE=$SLURM_ETC/slurm.conf
# First line of the files start.sh writes: a slurm.conf without it belongs
# to someone else and is never replaced.
CONF_MARK="# written by shardlm tools/slurm-local/start.sh"

PID_DIR=$SLURM_DIR/pid
LOG_DIR=$SLURM_DIR/log
MUNGE_DIR=$SLURM_DIR/munge
MUNGE_SOCKET=/run/munge/munge.socket.2
MUNGE_KEY=/etc/munge/munge.key

say() { echo "[slurm-local] $*" >&2; }
die() { say "error: $*"; exit 1; }

# is_running PIDFILE COMM: the pid in PIDFILE is alive, not a zombie, and
# named COMM (a recycled pid must never be signalled).
is_running() {
  local pid state
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)
  [ -n "$state" ] && [ "$state" != Z ]
}

# stop_daemon PIDFILE COMM: SIGTERM, then SIGKILL after 10 s.
stop_daemon() {
  local pidfile=$1 comm=$2 i
  if is_running "$pidfile" "$comm"; then
    kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      is_running "$pidfile" "$comm" || break
      sleep 0.1
    done
    if is_running "$pidfile" "$comm"; then
      say "$comm ignored SIGTERM for 10 s; killing it"
      kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  rm -f "$pidfile"
}

# The slurm.conf lines that start.sh's and two-hosts.sh's clusters share: no
# cgroups, no accounting, ranks started by srun through PMIx, nodes that
# advertise more CPUs than the machine has.
conf_local_cluster() {
  cat <<'CONF'
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# slurmd takes the CPU count below on trust
SlurmdParameters=config_overrides
# jobs larger than the node are refused at submission, not left pending
EnforcePartLimits=ALL
ReturnToService=2
MailProg=/bin/true
# batch jobs start at the next scheduler tick, not 3 s later
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
CONF
}
