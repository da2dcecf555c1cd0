#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the multi-node tests
# (tests/workflow/test_slurm_nodes.py). Debian 12, as root, with network namespaces.
#
#   scripts/slurm_nodes.sh up      install what is missing (apt), start the daemons and nodes
#   scripts/slurm_nodes.sh down    stop what `up` started (by pid), remove namespaces and links
#                                  (a failed `up` does so itself)
#   scripts/slurm_nodes.sh env     the line to source: export SLURM_CONF=…
#   scripts/slurm_nodes.sh lose N  node N fails: its slurmd and every process of its namespace
#                                  killed (by pid), then marked DOWN at once (as slurmctld
#                                  would after SlurmdTimeout)
#   scripts/slurm_nodes.sh back N  node N's slurmd again; the node returns to service
#
# Nodes node1 and node2, each a slurmd (`slurmd -N nodeN`) in its own network namespace
# (llnode1, llnode2) with its own hostname, addresses 10.241.17.1 and .2 on the bridge llbr0
# (slurmctld on the bridge, 10.241.17.254). The file system is shared, as NFS is on a
# cluster. Partitions, accounts and accounting as scripts/slurm_local.sh (whose functions
# this script sources); its own directory (/tmp/loopline-slurm-nodes), ports (slurmctld 16817,
# slurmdbd 16818, slurmd 16819 in each namespace, mariadb 13307), so the one-node cluster may
# run beside it. Clients on this host read $SLURM_CONF (`env`); inside a node /etc/slurm and
# /etc/hosts are the node's own (/etc/netns/llnodeN/* bound over them in its mount namespace), so srun
# inside a job (whose environment the Snakemake executor plugin strips of SLURM_CONF) finds
# this cluster, and the nodes' names resolve to their addresses. Exit status 3: it cannot be
# brought up here (not root, no `ip netns`, no Debian package); the reason is the last line on
# stderr.
set -euo pipefail

DIR=/tmp/loopline-slurm-nodes  # fixed, as the namespace and link names are: one such cluster per machine
DB_PORT=13307
NET=10.241.17
CTLD_ADDR=$NET.254
BRIDGE=llbr0
NODES=(1 2)
OTHER_CTLD_PID=${LOOPLINE_SLURM_DIR:-/tmp/loopline-slurm}/slurmctld.pid
# shellcheck source=slurm_local.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_local.sh"

node_lines() {
  local n
  for n in "${NODES[@]}"; do
    echo "NodeName=node$n NodeAddr=$NET.$n NodeHostname=node$n CPUs=$1 RealMemory=$2 State=UNKNOWN"
  done
  echo "PartitionName=main Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP"
  echo "PartitionName=train Nodes=node[1-2] MaxTime=INFINITE State=UP"
}

port_lines() {
  if [[ $1 == slurm.conf ]]; then
    echo "SlurmctldPort=16817"
    echo "SlurmdPort=16819"
    echo "AccountingStoragePort=16818"
  else
    echo "DbdPort=16818"
  fi
}

check_namespaces() {
  [[ $(id -u) == 0 ]] || cannot "not root (network namespaces need it)"
  command -v ip >/dev/null || cannot "no ip command (iproute2) for network namespaces"
  command -v unshare >/dev/null && command -v nsenter >/dev/null || cannot "no unshare/nsenter (util-linux) to give each node its hostname and /etc"
  ip netns add llnodeprobe 2>/dev/null || cannot "ip netns add failed: no network namespaces here"
  ip netns del llnodeprobe
}

make_network() {  # the bridge, a veth pair per node, each node's /etc (slurm, hosts)
  ip link add "$BRIDGE" type bridge
  ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n
  for n in "${NODES[@]}"; do
    ip netns add "llnode$n"
    ip link add "llveth$n" type veth peer name eth0 netns "llnode$n"
    ip link set "llveth$n" master "$BRIDGE" up
    ip -n "llnode$n" addr add "$NET.$n/24" dev eth0
    ip -n "llnode$n" link set eth0 up
    ip -n "llnode$n" link set lo up
    mkdir -p "/etc/netns/llnode$n/slurm"
    ln -sfn "$ETC/slurm.conf" "/etc/netns/llnode$n/slurm/slurm.conf"
    {
      echo "127.0.0.1 localhost"
      for m in "${NODES[@]}"; do echo "$NET.$m node$m"; done
      echo "$CTLD_ADDR $HOST"
    } >"/etc/netns/llnode$n/hosts"
  done
}

start_node() {  # start_node N: slurmd -N nodeN in namespace llnodeN, hostname nodeN, its /etc
  # (not `ip netns exec`: it mounts a fresh /sys, without the cgroups slurmd needs)
  local etc=/etc/netns/llnode$1
  nsenter --net="/run/netns/llnode$1" unshare --mount --uts sh -c \
    "mount --bind $etc/slurm /etc/slurm && mount --bind $etc/hosts /etc/hosts && hostname node$1 && exec /usr/sbin/slurmd -N node$1"
  LOG=$DIR/slurmd.node$1.log wait_for 30 "slurmd node$1" running "$DIR/slurmd.node$1.pid"
}

up() {
  mkdir -p "$DIR"
  if running "$DIR/slurmctld.pid"; then say "already up ($DIR)"; return 0; fi
  down  # what a failed `up` left
  check_namespaces
  install_packages
  # whatever fails from here on: down removes what was started and made (by pid, by name)
  trap 'rc=$?; trap - EXIT; ((rc == 0)) || { say "up failed: taking down what it started"; down; }; exit $rc' EXIT
  export SLURM_CONF=$ETC/slurm.conf
  write_configs yes
  make_network
  start_munge
  start_mariadb
  start_slurmdbd
  /usr/sbin/slurmctld
  LOG=$DIR/slurmctld.log wait_for 30 slurmctld scontrol ping
  local n
  for n in "${NODES[@]}"; do start_node "$n"; done
  LOG=$DIR/slurmctld.log wait_for 60 "nodes node1 and node2 idle" \
    bash -c "[[ \$(sinfo -h -N -p main -o %T | grep -cE '^(idle|mixed|allocated)') == ${#NODES[@]} ]]"
  trap - EXIT
  say "up: SLURM_CONF=$SLURM_CONF (nodes node1, node2 at $NET.1, $NET.2)"
}

kill_namespace() {  # every process of node N's namespace (its slurmd, steps, job processes)
  local pid
  ip netns list 2>/dev/null | grep -qw "llnode$1" || return 0
  for pid in $(ip netns pids "llnode$1" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$DIR/slurmd.node$1.pid"
}

lose() {
  export SLURM_CONF=$ETC/slurm.conf
  kill_namespace "$1"
  scontrol update "NodeName=node$1" State=DOWN Reason="lost (slurm_nodes.sh lose)"
}

back() {
  export SLURM_CONF=$ETC/slurm.conf
  start_node "$1"
  scontrol update "NodeName=node$1" State=RESUME 2>/dev/null || true
  LOG=$DIR/slurmctld.log wait_for 60 "node$1 idle" \
    bash -c "sinfo -h -n node$1 -o %T | grep -qE '^(idle|mixed|allocated)'"
}

down() {
  stop_daemons
  local n
  for n in "${NODES[@]}"; do
    kill_namespace "$n"
    ip netns del "llnode$n" 2>/dev/null || true
    ip link del "llveth$n" 2>/dev/null || true
    rm -rf "/etc/netns/llnode$n"
  done
  rmdir /etc/netns 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$DIR/spool"
  return 0
}

case ${1:-} in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$ETC/slurm.conf" ;;
  lose | back) [[ ${2:-} =~ ^[12]$ ]] || { echo "usage: $0 $1 1|2" >&2; exit 2; }; "$1" "$2" ;;
  *) echo "usage: $0 up | down | env | lose N | back N" >&2; exit 2 ;;
esac
