#!/usr/bin/env bash
# A two-host Slurm cluster on one machine, for multi-node jobs
# (tests/t_slurm_nodes.py) and for trying them by hand. Root only.
#
#   tools/slurm-local/two-hosts.sh start          # both hosts up, both nodes idle
#   tools/slurm-local/two-hosts.sh run node1 CMD  # CMD on host node1 (sbatch, squeue, ...)
#   tools/slurm-local/two-hosts.sh lose node2     # the host vanishes: link down, processes killed
#   tools/slurm-local/two-hosts.sh stop           # nothing left: no namespace, interface or process
#
# Each host is a network namespace (shardlm-node1, shardlm-node2) with a UTS
# namespace of its own (hostname node1, node2) and a mount namespace whose
# only change is a node-local TmpFS (DIR/tmp-HOST seen at DIR/tmp); a veth
# pair joins them,
# 10.213.77.1/24 <-> 10.213.77.2/24, and nothing routes out of them, so the
# jobs' traffic stays between these two addresses. node1 runs slurmctld and
# a slurmd, node2 a slurmd; the client commands work on either host (`run`).
# The mount namespace is the machine's: the project, /tmp and checkpoint
# directories are the same paths on both hosts, as a shared file system would
# make them.
#
# Apart from the single-node cluster of start.sh, which may run at the same
# time: its own munged (own key and socket under the state directory, given
# to Slurm by AuthInfo), its own slurm.conf (never /etc/slurm: clients need
# SLURM_CONF, which `run` sets), cluster name, ports and state directory.
#
# Environment: SHARDLM_TWO_HOSTS_DIR (state, config, logs, pid files; default
# /dev/shm/shardlm-two-hosts where /dev/shm is a tmpfs, else /tmp/...),
# SHARDLM_TWO_HOSTS_CPUS (CPUs each node advertises, default 8, so that several 4-rank jobs run at once on 2 cores).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/slurm-local/common.sh
source "$HERE/common.sh"
say() { echo "[two-hosts] $*" >&2; }

DIR=${SHARDLM_TWO_HOSTS_DIR:-$(dirname "$(default_slurm_dir)")/shardlm-two-hosts}
CONF=$DIR/slurm.conf
CPUS=${SHARDLM_TWO_HOSTS_CPUS:-8}
HOSTS=(node1 node2)
SUBNET=10.213.77
CTLD_PORT=6917   # the single-node cluster keeps Slurm's 6817/6818
SLURMD_PORT=6918
MUNGE_SOCK=$DIR/munge/munge.socket
daemon_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)

netns_of() { echo "shardlm-$1"; }
index_of() { case $1 in node1) echo 1 ;; node2) echo 2 ;; *) die "no host '$1' (node1 or node2)" ;; esac; }
veth_of() { echo "shl2h-$(index_of "$1")"; }
addr_of() { echo "$SUBNET.$(index_of "$1")"; }

# on HOST CMD...: CMD in HOST's network and UTS namespaces, with this
# cluster's config.
on() {
  local host=$1
  shift
  nsenter --net="/run/netns/$(netns_of "$host")" --uts="$DIR/ns/$host.uts" --mount="$DIR/ns/$host.mnt" \
    --wd="$PWD" env SLURM_CONF="$CONF" "$@"
}

write_conf() {
  local mem_mb
  mem_mb=$(awk '/^MemTotal:/ { print int($2 / 1024 / 2) }' /proc/meminfo)
  cat >"$CONF" <<CONF
# written by shardlm tools/slurm-local/two-hosts.sh
ClusterName=shardlm-two-hosts
SlurmctldHost=node1($(addr_of node1))
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
$(conf_local_cluster)
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
TmpFS=$DIR/tmp
SlurmctldPidFile=$DIR/pid/slurmctld.pid
SlurmdPidFile=$DIR/pid/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
NodeName=node1 NodeHostname=node1 NodeAddr=$(addr_of node1) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN
NodeName=node2 NodeHostname=node2 NodeAddr=$(addr_of node2) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN
PartitionName=hosts Nodes=node1,node2 Default=YES MaxTime=UNLIMITED State=UP
CONF
}

start_munged() {
  install -d -o munge -g munge -m 0755 "$DIR/munge"   # the socket's directory must be searchable
  runuser -u munge -- mungekey --create --keyfile="$DIR/munge/munge.key"
  "${daemon_env[@]}" runuser -u munge -- munged --socket="$MUNGE_SOCK" --key-file="$DIR/munge/munge.key" \
    --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid" \
    --seed-file="$DIR/munge/munged.seed" || die "munged did not start"
  ln -sf "$DIR/munge/munged.pid" "$DIR/pid/munged.pid"
}

make_hosts() {
  local host
  for host in "${HOSTS[@]}"; do
    ip netns add "$(netns_of "$host")"
    touch "$DIR/ns/$host.uts" "$DIR/ns/$host.mnt"
    unshare --uts="$DIR/ns/$host.uts" hostname "$host"
    # Slurm's pmix plugin makes per-step directories under TmpFS named
    # after the job and step only: each host needs a TmpFS of its own.
    install -d -m 1777 "$DIR/tmp-$host"
    unshare --mount="$DIR/ns/$host.mnt" --propagation slave mount --bind "$DIR/tmp-$host" "$DIR/tmp"
  done
  ip link add "$(veth_of node1)" netns "$(netns_of node1)" type veth \
    peer name "$(veth_of node2)" netns "$(netns_of node2)"
  for host in "${HOSTS[@]}"; do
    ip -n "$(netns_of "$host")" link set lo up
    ip -n "$(netns_of "$host")" addr add "$(addr_of "$host")/24" dev "$(veth_of "$host")"
    ip -n "$(netns_of "$host")" link set "$(veth_of "$host")" up
  done
}

wait_ready() {
  local i state
  for ((i = 0; i < 300; i++)); do
    state=$(on node1 timeout 5 sinfo -h -o '%n=%T' 2>/dev/null | sort | tr '\n' ' ' || true)
    if [ "$state" = "node1=idle node2=idle " ] && grep -q 'SchedulerParameters=' "$DIR/log/slurmctld.log" 2>/dev/null; then
      say "ready: hosts node1 ($(addr_of node1), slurmctld) and node2 ($(addr_of node2)), $CPUS CPUs each;" \
        "clients: $0 run node1 CMD (or SLURM_CONF=$CONF inside the namespaces); logs in $DIR/log"
      return 0
    fi
    is_running "$DIR/pid/slurmctld.pid" slurmctld || { tail -n 20 "$DIR/log/slurmctld.log" >&2; die "slurmctld exited"; }
    sleep 0.2
  done
  tail -n 20 "$DIR/log/"*.log >&2
  die "the nodes are not idle after 60 s ($state)"
}

cmd_start() {
  local host
  bash "$HERE/../deps.sh" --slurm || die "could not install the Slurm packages"
  for tool in ip nsenter unshare; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install iproute2 util-linux"
  done
  cmd_stop 2>/dev/null || true
  rm -rf "${DIR:?}"
  mkdir -p "$DIR/pid" "$DIR/log" "$DIR/state" "$DIR/ns" "$DIR/tmp"
  write_conf
  start_munged
  make_hosts
  on node1 "${daemon_env[@]}" slurmctld -f "$CONF" >"$DIR/log/slurmctld.out" 2>&1 || die "slurmctld did not start"
  for host in "${HOSTS[@]}"; do
    on "$host" "${daemon_env[@]}" slurmd -f "$CONF" -N "$host" >"$DIR/log/slurmd-$host.out" 2>&1 ||
      die "slurmd on $host did not start"
  done
  wait_ready
}

# kill_host HOST: every process in HOST's network namespace, SIGTERM then
# SIGKILL (they are this cluster's daemons and the jobs they started).
kill_host() {
  local ns pids i
  ns=$(netns_of "$1")
  [ -e "/run/netns/$ns" ] || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # one pid per word
  kill -"${2:-TERM}" $pids 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2046
  kill -KILL $(ip netns pids "$ns") 2>/dev/null || true
  sleep 0.2
}

cmd_stop() {
  local host
  # Jobs go with their hosts: a later start wipes the saved state.
  for host in "${HOSTS[@]}"; do
    kill_host "$host"
  done
  stop_daemon "$DIR/pid/munged.pid" munged
  for host in "${HOSTS[@]}"; do
    [ -e "/run/netns/$(netns_of "$host")" ] && ip netns del "$(netns_of "$host")"
  done
  # Open MPI's shared-memory segments of ranks that were killed (a lost
  # host): they are named after the host, and these host names are ours.
  for host in "${HOSTS[@]}"; do
    rm -f /dev/shm/vader_segment."$host".*
  done
  # the namespace files (DIR/ns/*), bound to keep the namespaces alive
  findmnt -rn -o TARGET | grep "^$DIR/" | sort -r | xargs -r umount
  rm -f "$DIR/ns/"*
  say "stopped"
}

# The host vanishes as a crashed node does: its link goes down first (so no
# connection is closed politely), then everything on it is killed.
cmd_lose() {
  local host=$1
  ip -n "$(netns_of "$host")" link set "$(veth_of "$host")" down
  kill_host "$host" KILL
  say "$host lost: link down, processes killed"
}

[ "$(id -u)" = 0 ] || die "run as root (it makes namespaces and starts system daemons)"
case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  run) [ $# -ge 3 ] || die "usage: $0 run HOST CMD [ARGS...]"; host=$2; shift 2; on "$host" "$@" ;;
  lose) [ $# -eq 2 ] || die "usage: $0 lose HOST"; cmd_lose "$2" ;;
  *) die "usage: $0 start | stop | run HOST CMD [ARGS...] | lose HOST" ;;
esac
