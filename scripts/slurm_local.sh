#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the tests (tests/workflow/test_slurm.py)
# and for trying profiles/slurm by hand. Debian 12, as root.
#
#   scripts/slurm_local.sh up [--no-accounting]   install what is missing (apt), start the daemons
#   scripts/slurm_local.sh down                   stop what `up` started (by pid), nothing else
#   scripts/slurm_local.sh env                    the line to source: export SLURM_CONF=…
#
# The cluster: node $(hostname -s) with all its cores, partitions `main` (default) and `train`,
# accounts `root` (everyone's default) and `loopline` (named by `resources.slurm_account`),
# SLURM's defaults otherwise (no RequeueExit: Snakemake resubmits a stopped segment).
# With accounting (the default), mariadb + slurmdbd keep job records, so `sacct` works;
# `--no-accounting` runs slurmctld and slurmd alone, as many small clusters do.
# Everything lives under $LOOPLINE_SLURM_DIR (default /tmp/loopline-slurm): its config, state,
# logs and pid files. /etc/slurm/slurm.conf becomes a link to its config while it is up, as on
# a real cluster where every client (and srun inside a job, whose environment the Snakemake
# executor plugin strips of SLURM_* variables, SLURM_CONF included) reads it there; an
# /etc/slurm/slurm.conf that is not ours is never touched (exit 3). A munged that already
# runs is used, not restarted. Exit status 3: the cluster cannot be brought up here (not root,
# no apt, no Debian package); the reason is the last line on stderr.
# scripts/slurm_nodes.sh (a two-node cluster) sources this file for its functions: it sets
# DIR, DB_PORT and CTLD_ADDR before `source`, then overrides the hooks node_lines and port_lines.
set -euo pipefail

DIR=${DIR:-${LOOPLINE_SLURM_DIR:-/tmp/loopline-slurm}}
ETC=$DIR/etc
HOST=$(hostname -s)
DB_PORT=${DB_PORT:-${LOOPLINE_SLURM_DB_PORT:-13306}}
CTLD_ADDR=${CTLD_ADDR:-127.0.0.1}
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

say() { echo "$(basename "$0" .sh): $*" >&2; }
cannot() { say "cannot bring up Slurm here: $*"; exit 3; }

running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for ((i = 0; i < limit * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what did not come up within ${limit}s; its log:"; tail -n 20 "${LOG:-/dev/null}" >&2 || true
  exit 1
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || cannot "not root, and ${missing[*]} not installed"
  command -v apt-get >/dev/null || cannot "no apt-get to install ${missing[*]}"
  say "installing ${missing[*]} (apt-get)"
  # Debian's maintainer scripts would start the daemons: policy-rc.d says no while we install
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; made_policy=1; fi
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    >"$DIR/apt.log" 2>&1 || { ((made_policy)) && rm -f "$policy"; cannot "apt-get install ${missing[*]} failed (see $DIR/apt.log)"; }
  ((made_policy)) && rm -f "$policy"
  return 0
}

# This cluster's nodes and partitions (slurm_nodes.sh: two nodes); $1 CPUs, $2 MB per node.
node_lines() {
  echo "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$1 RealMemory=$2 State=UNKNOWN"
  echo "PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
  echo "PartitionName=train Nodes=$HOST MaxTime=INFINITE State=UP"
}

port_lines() { :; }  # $1: slurm.conf or slurmdbd.conf; Slurm's default ports here

write_configs() {
  local accounting=$1 cpus mem
  cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  mkdir -p "$ETC" "$DIR/ctld" "$DIR/spool"
  {
    echo "ClusterName=loopline"
    echo "SlurmctldHost=$HOST($CTLD_ADDR)"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$DIR/ctld"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/slurmd.%n.pid"
    echo "SlurmctldLogFile=$DIR/slurmctld.log"
    echo "SlurmdLogFile=$DIR/slurmd.%n.log"
    port_lines slurm.conf
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core_Memory"
    echo "ReturnToService=2"
    echo "MinJobAge=600"       # squeue still knows a finished job for 10 minutes
    echo "KillWait=20"         # SIGTERM at the time limit, SIGKILL 20 s later
    echo "OverTimeLimit=0"
    echo "JobRequeue=1"
    echo "SchedulerParameters=sched_interval=5"
    if [[ $accounting == yes ]]; then
      echo "AccountingStorageType=accounting_storage/slurmdbd"
      echo "AccountingStorageHost=$HOST"
      echo "AccountingStorageEnforce=associations"
      echo "AccountingStoreFlags=job_comment"  # sacct shows the rule and wildcards
      echo "JobAcctGatherType=jobacct_gather/linux"
      echo "JobAcctGatherFrequency=30"
    else
      echo "AccountingStorageType=accounting_storage/none"
      echo "JobAcctGatherType=jobacct_gather/none"
    fi
    node_lines "$cpus" "$mem"
  } >"$ETC/slurm.conf"
  cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$HOST
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=loopline
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/slurmdbd.log
$(port_lines slurmdbd.conf)
EOF
  chmod 600 "$ETC/slurmdbd.conf"
  echo "$accounting" >"$DIR/accounting"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create >/dev/null
  runuser -u munge -- /usr/sbin/munged
  LOG=/var/log/munge/munged.log wait_for 10 munged bash -c 'munge -n | unmunge'
  cp /run/munge/munged.pid "$DIR/munged.pid"
}

start_mariadb() {
  local data=$DIR/mysql
  if [[ ! -d $data/mysql ]]; then
    mariadb-install-db --user=root --datadir="$data" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/mariadb-install.log" 2>&1 || cannot "mariadb-install-db failed (see $DIR/mariadb-install.log)"
  fi
  /usr/sbin/mariadbd --no-defaults --user=root --datadir="$data" --socket="$DIR/mysqld.sock" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$DIR/mariadb.pid" \
    --log-error="$DIR/mariadb.log" --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
  LOG=$DIR/mariadb.log wait_for 30 mariadb mariadb --no-defaults --socket="$DIR/mysqld.sock" -uroot -e "select 1"
  mariadb --no-defaults --socket="$DIR/mysqld.sock" -uroot -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'loopline';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'loopline';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start_slurmdbd() {
  /usr/sbin/slurmdbd
  LOG=$DIR/slurmdbd.log wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster loopline >/dev/null 2>&1 || true
  sacctmgr -i add account loopline Description=tests Organization=loopline >/dev/null 2>&1 || true
  sacctmgr -i add user root Account=loopline >/dev/null 2>&1 || true
}

SYSTEM_CONF=/etc/slurm/slurm.conf

link_config() {
  if [[ -e $SYSTEM_CONF || -L $SYSTEM_CONF ]]; then
    [[ $(readlink "$SYSTEM_CONF" 2>/dev/null) == "$ETC/slurm.conf" ]] && return 0
    cannot "$SYSTEM_CONF exists and is not this script's: not touching another cluster's configuration"
  fi
  mkdir -p /etc/slurm
  ln -s "$ETC/slurm.conf" "$SYSTEM_CONF"
}

up() {
  local accounting=yes
  [[ ${1:-} == --no-accounting ]] && accounting=no
  mkdir -p "$DIR"
  if running "$DIR/slurmctld.pid"; then
    [[ $(cat "$DIR/accounting" 2>/dev/null) == "$accounting" ]] && { say "already up ($DIR)"; return 0; }
    down
  fi
  install_packages
  export SLURM_CONF=$ETC/slurm.conf
  write_configs "$accounting"
  link_config
  start_munge
  if [[ $accounting == yes ]]; then start_mariadb; start_slurmdbd; fi
  /usr/sbin/slurmctld  # its state (job ids go on counting) is kept between up and down
  LOG=$DIR/slurmctld.log wait_for 30 slurmctld scontrol ping
  /usr/sbin/slurmd
  LOG=$DIR/slurmd.log wait_for 30 "slurmd (node $HOST idle)" bash -c "sinfo -h -N -o %T | grep -qE '^(idle|mixed|allocated)'"
  say "up: SLURM_CONF=$SLURM_CONF (accounting: $accounting)"
}

stop_pid() {  # stop_pid PIDFILE: SIGTERM, up to 30 s, then SIGKILL; the file goes too
  local pid
  [[ -f $1 ]] || return 0
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$1"
}

# The clusters of both scripts share one munged: the one that started it leaves it running
# while the other is up.
OTHER_CTLD_PID=${OTHER_CTLD_PID:-/tmp/loopline-slurm-nodes/slurmctld.pid}

stop_daemons() {  # this cluster's jobs first, then its daemons (slurmd.*: one per node)
  local f
  if running "$DIR/slurmctld.pid"; then
    SLURM_CONF=$ETC/slurm.conf scancel --full --quiet $(SLURM_CONF=$ETC/slurm.conf squeue -h -o %i) 2>/dev/null || true
  fi
  for f in "$DIR"/slurmd.*.pid "$DIR/slurmctld.pid" "$DIR/slurmdbd.pid" "$DIR/mariadb.pid"; do
    stop_pid "$f"
  done
  running "$OTHER_CTLD_PID" || stop_pid "$DIR/munged.pid"
}

down() {
  stop_daemons
  # job steps a killed slurmd left behind: this cluster's only (in this network namespace;
  # the two-node cluster's live in their own)
  local pid here
  here=$(readlink /proc/self/ns/net)
  for pid in $(pgrep -f "slurmstepd: \[" || true); do
    [[ $(readlink "/proc/$pid/ns/net" 2>/dev/null) == "$here" ]] && kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$DIR/spool"
  [[ $(readlink "$SYSTEM_CONF" 2>/dev/null) == "$ETC/slurm.conf" ]] && rm -f "$SYSTEM_CONF"
  return 0
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0  # sourced (slurm_nodes.sh): functions only

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  env) echo "export SLURM_CONF=$ETC/slurm.conf" ;;
  *) echo "usage: $0 up [--no-accounting] | down | env" >&2; exit 2 ;;
esac
