#!/usr/bin/env bash
# Starts a real single-node Slurm cluster on this machine (munged, slurmctld
# and slurmd on 127.0.0.1) for tests/t_slurm.sh and for trying the job
# scripts of jobs/ by hand. Root only; needs neither systemd nor cgroups.
# Installs the Debian packages it needs (tools/deps.sh --slurm) when missing.
#
# Every start is a clean one: a cluster left by an earlier start is stopped
# and its saved jobs and logs are wiped, so job ids restart at 1.
#
# The node: this host, CPUs = max(nproc, 8) (slurmd is told to believe the
# config, so an 8-task job fits on 2 cores), no GPUs. One partition,
# "debug", no time limit. MpiDefault=pmix: srun starts Open MPI
# ranks itself. No accounting (sacct does not work: use scontrol show job).
#
# Environment: SHARDLM_SLURM_DIR (state, logs, pid files; default
# /dev/shm/shardlm-slurm where /dev/shm is a tmpfs, else /tmp/shardlm-slurm).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/slurm-local/common.sh
source "$HERE/common.sh"
[ "$(id -u)" = 0 ] || die "run as root (it starts system daemons)"

bash "$HERE/../deps.sh" --slurm || die "could not install the Slurm packages"

# The daemons must not inherit a job's SLURM_* variables or the caller's
# Open MPI settings.
daemon_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
node=$(hostname -s)
cpus=$(nproc)
[ "$cpus" -lt 8 ] && cpus=8
mem_mb=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)

if [ -e "$SLURM_CONF_FILE" ] && [ "$(head -1 "$SLURM_CONF_FILE")" != "$CONF_MARK" ]; then
  die "$SLURM_CONF_FILE was not written by this script; a real cluster's config is never replaced"
fi
if timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' &&
   ! is_running "$PID_DIR/slurmctld.pid" slurmctld; then
  die "a slurmctld that this script did not start is answering; stop it first"
fi

bash "$HERE/stop.sh" 2>/dev/null || true
rm -rf "${SLURM_DIR:?}"
mkdir -p "$PID_DIR" "$LOG_DIR" "$SLURM_DIR/state" "$SLURM_DIR/spool" "$SLURM_ETC"
install -d -m 1777 "$SLURM_DIR/tmp"
install -d -o munge -g munge -m 0700 "$MUNGE_DIR"

cat >"$SLURM_CONF_FILE" <<CONF
$CONF_MARK
ClusterName=shardlm-local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
$(conf_local_cluster)
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
TmpFS=$SLURM_DIR/tmp
SlurmctldPidFile=$PID_DIR/slurmctld.pid
SlurmdPidFile=$PID_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=UNLIMITED State=UP
CONF

# munged: a key of its own if there is none, run as the munge user.
if [ ! -e "$MUNGE_KEY" ]; then
  install -d -o munge -g munge -m 0700 /etc/munge
  mungekey --create --keyfile="$MUNGE_KEY"
fi
chown munge:munge "$MUNGE_KEY"
chmod 0600 "$MUNGE_KEY"
install -d -o munge -g munge -m 0755 /run/munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "using the munged already running"
else
  rm -f "$MUNGE_SOCKET"   # left by a killed munged, it would stop a new one
  "${daemon_env[@]}" runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
    --log-file="$MUNGE_DIR/munged.log" --pid-file="$MUNGE_DIR/munged.pid" \
    --seed-file="$MUNGE_DIR/munged.seed" || die "munged did not start"
  ln -sf "$MUNGE_DIR/munged.pid" "$PID_DIR/munged.pid"
fi

"${daemon_env[@]}" slurmctld -f "$SLURM_CONF_FILE" >"$LOG_DIR/slurmctld.out" 2>&1 || die "slurmctld did not start"
"${daemon_env[@]}" slurmd -f "$SLURM_CONF_FILE" -N "$node" >"$LOG_DIR/slurmd.out" 2>&1 || die "slurmd did not start"

# Ready when the node is idle and slurmctld's scheduler has run once (until
# then it keeps its built-in 3 s delay for batch jobs); it logs its
# SchedulerParameters on that first run.
for ((i = 0; i < 300; i++)); do
  state=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null || true)
  if [ "$state" = idle ] && grep -q 'SchedulerParameters=' "$LOG_DIR/slurmctld.log" 2>/dev/null; then
    say "ready: node $node, $cpus CPUs, partition debug; logs in $LOG_DIR"
    exit 0
  fi
  for d in slurmctld slurmd; do
    is_running "$PID_DIR/$d.pid" "$d" || { tail -n 20 "$LOG_DIR/$d.log" "$LOG_DIR/$d.out" >&2; die "$d exited"; }
  done
  case $state in
    *drain* | *inval* | down*) timeout 5 sinfo -R >&2; die "the node is $state" ;;
  esac
  sleep 0.2
done
tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2
die "the node is not idle after 60 s (state '$state')"
