#!/usr/bin/env bash
# A real Slurm cluster for tests: munge, MariaDB + slurmdbd (so sacct works as on
# production clusters), slurmctld and one slurmd per node, all as root, all state under one
# folder. One node by default; several with HPCMEM_SLURM_NODES (see below).
#
#   tools/slurm/cluster.sh start  [DIR]   start what is not running; prints `export SLURM_CONF=...`
#   tools/slurm/cluster.sh stop   [DIR]   cancel jobs, stop every daemon (also when half-started)
#   tools/slurm/cluster.sh status [DIR]   daemons, pids, sinfo; exit 0 only when all are up
#   tools/slurm/cluster.sh login  [DIR] -- CMD...   run CMD where the cluster's clients
#                                         work (the head namespace of a multi-node cluster)
#   tools/slurm/cluster.sh node-down DIR NODE   kill NODE's slurmd and everything it runs
#   tools/slurm/cluster.sh node-up   DIR NODE   start NODE's slurmd again, wait until it is idle
#   tools/slurm/cluster.sh vm-node DIR OUT [BOOT_OPTION...] [-- CMD...]   boot the VM node
#                                         (below) and serve its jobs until `touch OUT/stop`;
#                                         CMD runs in it first; BOOT_OPTIONs go to
#                                         tools/vm/boot.py (--share-rw PATH: a scratch folder)
#
# DIR defaults to .slurm/ in the repository. Logs stay under DIR/log after stop.
# Usage from a shell:  eval "$(tools/slurm/cluster.sh start)"; sbatch ...
#
# Settings (environment; read by start, which regenerates the configuration):
#   HPCMEM_SLURM_PORT        slurmctld port (default 16817; slurmd = +1, slurmdbd = +2)
#   HPCMEM_SLURM_MYSQL_PORT  MariaDB port (default 16306)
#   HPCMEM_SLURM_CLUSTER     ClusterName (default hpcmem)
#   HPCMEM_SLURM_PARTITION   the partitions, comma-separated, each with the one node; the
#                            first is the default for jobs (default debug)
#   HPCMEM_SLURM_ACCOUNT     the account root submits under, its default (default hpcmem)
#   HPCMEM_SLURM_QOS         a QOS created besides Slurm's "normal" and allowed to root; the
#                            default QOS stays "normal" (default: none created)
#   HPCMEM_SLURM_ENFORCE     AccountingStorageEnforce (default: none, nothing enforced)
#   HPCMEM_SLURM_MAX_TIME    every partition's MaxTime: minutes, [days-]hours:minutes:seconds
#                            or INFINITE (default INFINITE)
#   HPCMEM_SLURM_DEFAULT_TIME  every partition's DefaultTime, the same forms (default: none,
#                            a job without --time gets MaxTime)
#   HPCMEM_SLURM_QOS_LIMITS  sacctmgr limits of HPCMEM_SLURM_QOS, space-separated, e.g.
#                            "MaxWall=30 MaxTRESPerJob=cpu=2 MaxSubmitJobsPU=20" (default none)
#   HPCMEM_SLURM_CPUS        CPUs of each node, at most this machine's (default: all of them,
#                            as `slurmd -C` finds them): a site with smaller nodes
#   HPCMEM_SLURM_NODES       nodes, 1-8 (default 1). With more than one, the cluster lives in
#                            network namespaces of its own (tools/slurm/netns.sh): the head
#                            (login node, controller, slurmdbd, MariaDB) and node1..nodeN, each
#                            with its own host name and address on a private bridge; clients
#                            run in the head: `cluster.sh login DIR -- sbatch ...`
#   HPCMEM_SLURM_VM_NODE     a tools/vm topology (tools/vm/boot.py), one more node of a one-node
#                            cluster: that QEMU guest, named after it, with its CPUs, memory and
#                            features (e.g. hbm), alone in partition HPCMEM_SLURM_VM_PARTITION.
#                            start does not boot it; `vm-node` does, and its slurmd registers
#                            configless through ports forwarded on 127.0.0.1 (slurmctld's, and
#                            the node's at HPCMEM_SLURM_PORT + 3), as the guest reaches nothing
#                            else; its slurmd log is DIR/log/slurmd-NODE.log. Default: none
#   HPCMEM_SLURM_VM_PARTITION  the VM node's partition, not one of HPCMEM_SLURM_PARTITION
#                            (default hbm)
# A site-like cluster, as production clusters are set up (jobs need a valid account, QOS
# and partition, and limits are enforced):
#   HPCMEM_SLURM_PARTITION=batch,hbm HPCMEM_SLURM_ACCOUNT=hpc HPCMEM_SLURM_QOS=bench \
#   HPCMEM_SLURM_ENFORCE=associations,limits,qos HPCMEM_SLURM_MAX_TIME=30 \
#   HPCMEM_SLURM_QOS_LIMITS="MaxTRESPerJob=cpu=2" tools/slurm/cluster.sh start
# A start with other settings than those of the running cluster, or whose configuration
# differs from its slurm.conf (a hand edit), is refused naming what differs (exit 2):
# slurmctld keeps what it started with, so stop the cluster and start it again.
#
# Several clusters may run on one machine, each with its own DIR and ports. They share one
# munged on the default socket (Slurm 22.05 ignores AuthInfo=socket= on its connections to
# slurmdbd); stop ends that munged only when no other Slurm daemon is left on the machine,
# and starts and stops take turns on the machine (the lock HPCMEM_SLURM_MACHINE_LOCK names,
# default /run/lock/hpcmem-slurm.lock).
# slurmd runs in a mount namespace of its own with DIR/run/slurm as /run/slurm, so the
# configless cache that srun inside jobs reads (/run/slurm/conf) is this cluster's.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
ACTION="${1:-}"
STATE_ARG="${2:-}"
[[ "$STATE_ARG" != "--" ]] || STATE_ARG=""  # login -- CMD: the default DIR
STATE="$(realpath -m "${STATE_ARG:-$REPO/.slurm}")"
# Every action but start acts on the cluster as start made it (nodes, ports, names).
if [[ "$ACTION" != start && -s "$STATE/etc/settings.env" ]]; then
  source "$STATE/etc/settings.env"
fi
CLUSTER="${HPCMEM_SLURM_CLUSTER:-hpcmem}"
ACCOUNT="${HPCMEM_SLURM_ACCOUNT:-hpcmem}"
PARTITION="${HPCMEM_SLURM_PARTITION:-debug}"
QOS="${HPCMEM_SLURM_QOS:-}"
ENFORCE="${HPCMEM_SLURM_ENFORCE:-}"
NODES="${HPCMEM_SLURM_NODES:-1}"
CPUS="${HPCMEM_SLURM_CPUS:-}"
MAX_TIME="${HPCMEM_SLURM_MAX_TIME:-INFINITE}"
DEFAULT_TIME="${HPCMEM_SLURM_DEFAULT_TIME:-}"
QOS_LIMITS="${HPCMEM_SLURM_QOS_LIMITS:-}"
VM_NODE="${HPCMEM_SLURM_VM_NODE:-}"
VM_PARTITION="${HPCMEM_SLURM_VM_PARTITION:-hbm}"
CTLD_PORT="${HPCMEM_SLURM_PORT:-16817}"
MYSQL_PORT="${HPCMEM_SLURM_MYSQL_PORT:-16306}"
for port in "$CTLD_PORT" "$MYSQL_PORT"; do
  [[ "$port" =~ ^[0-9]+$ ]] && ((port > 0 && port < 65534)) ||
    { echo "cluster.sh: error: port '$port' is not a number in 1-65533" >&2; exit 2; }
done
for setting in "HPCMEM_SLURM_CLUSTER=$CLUSTER" "HPCMEM_SLURM_ACCOUNT=$ACCOUNT" \
  "HPCMEM_SLURM_QOS=$QOS"; do
  [[ "${setting#*=}" =~ ^[a-z0-9_]*$ ]] ||
    { echo "cluster.sh: error: $setting: use lower-case letters, digits and _" >&2; exit 2; }
done
[[ "$PARTITION" =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_PARTITION=$PARTITION: names (a-z, 0-9, _), comma-separated" >&2; exit 2; }
[[ "$ENFORCE" =~ ^[a-z,]*$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_ENFORCE=$ENFORCE: a list like associations,limits,qos" >&2; exit 2; }
[[ "$NODES" =~ ^[1-8]$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_NODES=$NODES: a number of nodes in 1-8" >&2; exit 2; }
[[ -z "$CPUS" || "$CPUS" =~ ^[1-9][0-9]{0,3}$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_CPUS=$CPUS: a number of CPUs per node, at least 1" >&2; exit 2; }
TIME_FORM='^(INFINITE|UNLIMITED|[0-9]+|([0-9]+-)?[0-9]+(:[0-9]+){1,2}|[0-9]+-[0-9]+)$'
for setting in "HPCMEM_SLURM_MAX_TIME=$MAX_TIME" "HPCMEM_SLURM_DEFAULT_TIME=$DEFAULT_TIME"; do
  [[ -z "${setting#*=}" && "$setting" == *DEFAULT_TIME=* || "${setting#*=}" =~ $TIME_FORM ]] ||
    { echo "cluster.sh: error: $setting: minutes, [days-]hours:minutes:seconds or INFINITE" >&2; exit 2; }
done
[[ "$QOS_LIMITS" =~ ^([A-Za-z]+=[A-Za-z0-9=,/:._-]+( |$))*$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_QOS_LIMITS=$QOS_LIMITS: sacctmgr limits, e.g. \"MaxWall=30 MaxTRESPerJob=cpu=2\"" >&2; exit 2; }
[[ -z "$QOS_LIMITS" || -n "$QOS" ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_QOS_LIMITS needs HPCMEM_SLURM_QOS, the QOS they limit" >&2; exit 2; }
[[ "$VM_NODE" =~ ^[a-z0-9-]*$ && "$VM_PARTITION" =~ ^[a-z0-9_]+$ ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_VM_NODE=$VM_NODE HPCMEM_SLURM_VM_PARTITION=$VM_PARTITION: a topology of tools/vm/boot.py, a partition name" >&2; exit 2; }
[[ -z "$VM_NODE" || ( "$NODES" == 1 && ",$PARTITION," != *",$VM_PARTITION,"* ) ]] ||
  { echo "cluster.sh: error: HPCMEM_SLURM_VM_NODE needs a one-node cluster and a partition of its own (HPCMEM_SLURM_VM_PARTITION=$VM_PARTITION is in HPCMEM_SLURM_PARTITION=$PARTITION)" >&2; exit 2; }
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
#: the VM node's slurmd, forwarded from 127.0.0.1 into the guest
VM_PORT=$((CTLD_PORT + 3))
HOST="$(hostname -s)"
ADDR=127.0.0.1
CTLD_HOST="$HOST($ADDR)"
NODE_NAMES=("$HOST")
TMP_FS=/tmp
#: seconds before slurmctld marks a silent node DOWN (a lost node fails its jobs this soon)
SLURMD_TIMEOUT=30
if ((NODES > 1)); then
  source "$HERE/netns.sh"
  ADDR="$SUBNET.1"
  HOST="$HEAD_NAME"
  # by name only: it resolves in the cluster's namespaces alone, so a client run outside
  # them fails at once instead of sending anything to an address outside
  CTLD_HOST="$HEAD_NAME"
  TMP_FS="$STATE/tmp"
  SLURMD_TIMEOUT=10
  NODE_NAMES=()
  for ((i = 1; i <= NODES; i++)); do NODE_NAMES+=("node$i"); done
fi
MUNGE_SOCKET=/run/munge/munge.socket.2
#: the munged this script starts is shared by every test cluster on the machine
MUNGE_PIDFILE=/run/munge/hpcmem-munged.pid
TIMEOUT="${HPCMEM_SLURM_TIMEOUT:-60}"
DAEMONS=(munged mariadbd slurmdbd slurmctld "${NODE_NAMES[@]/#/slurmd-}")

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 start|stop|status [STATE_DIR] | login [STATE_DIR] -- CMD... |" \
    "node-down|node-up STATE_DIR NODE | vm-node STATE_DIR OUT [BOOT_OPTION...] [-- CMD...]" >&2
  exit 2
}

# MariaDB drops root for the mysql user, which must reach its folder: STATE/mysql when every
# parent of STATE is searchable by that user (a checkout under /root is not), else a folder of
# its own under /var/tmp named after STATE, linked from STATE/mysql.
mysql_home() {
  if id mysql >/dev/null 2>&1 && ! runuser -u mysql -- test -x "$(dirname "$STATE")" 2>/dev/null; then
    echo "/var/tmp/hpcmem-slurm-$(printf %s "$STATE" | sha1sum | cut -c1-12)"
  else
    echo "$STATE/mysql"
  fi
}
MYSQL_DIR="$(mysql_home)"
if [[ "$MYSQL_DIR" == "$STATE/mysql" ]]; then
  MARIADB_LOG="$STATE/log/mariadbd.log"
else
  MARIADB_LOG="$MYSQL_DIR/mariadbd.log"
fi

pidfile() {
  if [[ "$1" == mariadbd ]]; then echo "$MYSQL_DIR/mariadbd.pid"; else echo "$STATE/run/$1.pid"; fi
}

# The pid of a running daemon from its pid file, or nothing.
daemon_pid() {
  local file pid
  file="$(pidfile "$1")"
  [[ -s "$file" ]] || return 1
  pid="$(tr -dc '0-9' <"$file")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# Wait until "$@" succeeds, at most TIMEOUT seconds; $1 names what we wait for.
wait_for() {
  local what="$1" deadline=$((SECONDS + TIMEOUT))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${TIMEOUT}s waiting for $what (logs: $STATE/log)"
    sleep 0.2
  done
}

# Render $1.in into $2 (default STATE/etc/$1).
render() {
  local target="${2:-$STATE/etc/$1}"
  sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@ADDR@|$ADDR|g" \
    -e "s|@CLUSTER@|$CLUSTER|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@MYSQL_PORT@|$MYSQL_PORT|g" \
    -e "s|@DB_PASSWORD@|$(cat "$STATE/etc/db.password")|g" \
    -e "s|@NODE_LINES@|$NODE_LINES|g" -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g" \
    -e "s|@ENFORCE_LINE@|${ENFORCE:+AccountingStorageEnforce=$ENFORCE}|g" \
    -e "s|@PARTITION_LINES@|$PARTITION_LINES|g" \
    -e "s|@TMP_FS@|$TMP_FS|g" -e "s|@CTLD_HOST@|$CTLD_HOST|g" \
    -e "s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" \
    "$HERE/$1.in" >"$target.tmp"
  mv "$target.tmp" "$target"
}

check_tools() {
  local missing=() tool
  for tool in munged mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sacctmgr \
    sinfo sacct scancel squeue; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) || die "missing ${missing[*]}: run \`make setup\` (installs slurm-wlm slurmdbd munge mariadb-server)"
  [[ $(id -u) -eq 0 ]] || die "the test cluster runs its daemons as root; run as root"
  local pmix=/usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so
  [[ -e "$pmix" ]] || die "$pmix missing: MpiDefault=pmix needs Debian's slurm-wlm with PMIx"
  local socket="$MYSQL_DIR/mysqld.sock"
  ((${#socket} < 100)) || die "state dir too deep for a unix socket path ($socket)"
}

# The settings start was given, as the shell lines later actions read back.
settings() {
  local setting
  for setting in CLUSTER=$CLUSTER ACCOUNT=$ACCOUNT PARTITION=$PARTITION QOS=$QOS \
    ENFORCE=$ENFORCE NODES=$NODES CPUS=$CPUS PORT=$CTLD_PORT MYSQL_PORT=$MYSQL_PORT \
    MAX_TIME=$MAX_TIME DEFAULT_TIME=$DEFAULT_TIME QOS_LIMITS="$QOS_LIMITS" \
    VM_NODE=$VM_NODE VM_PARTITION=$VM_PARTITION; do
    printf 'export HPCMEM_SLURM_%s=%q\n' "${setting%%=*}" "${setting#*=}"
  done
}

# The lines of slurm.conf that come from this machine and the settings.
describe_nodes() {
  # `slurmd -C` describes this machine (CPUs, sockets, cores, memory): every node has its
  # CPUs (the nodes of a multi-node cluster share them) and a share of its memory, with a
  # little kept spare.
  local detected mem
  detected="$(slurmd -C | head -n 1)"
  mem="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$detected")"
  [[ -n "$mem" ]] || die "could not read RealMemory from \`slurmd -C\`: $detected"
  mem=$((mem * 9 / 10 / NODES))
  local cpus index=0 name addr
  cpus="$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$detected")"
  if [[ -n "$CPUS" ]]; then
    # fewer CPUs than the machine has, as one socket of that many cores (slurmd takes the
    # configured node, SlurmdParameters=config_overrides)
    ((CPUS <= ${cpus:-1})) || { log "error: HPCMEM_SLURM_CPUS=$CPUS: more than this machine's ${cpus:-1} CPUs"; exit 2; }
    cpus="$CPUS"
    detected="$(sed -E -e "s/CPUs=[0-9]+/CPUs=$CPUS/" -e "s/Boards=[0-9]+/Boards=1/" \
      -e "s/SocketsPerBoard=[0-9]+/SocketsPerBoard=1/" -e "s/CoresPerSocket=[0-9]+/CoresPerSocket=$CPUS/" \
      -e "s/ThreadsPerCore=[0-9]+/ThreadsPerCore=1/" <<<"$detected")"
  fi
  DEF_MEM_PER_CPU=$((mem / ${cpus:-1}))
  NODE_LINES=""
  for name in "${NODE_NAMES[@]}"; do
    index=$((index + 1))
    addr="$ADDR"
    ((NODES == 1)) || addr="$(node_addr "$index")"
    NODE_LINES+="$(sed -e "s/NodeName=[^ ]*/NodeName=$name NodeAddr=$addr/" \
      -e "s/RealMemory=[0-9]*/RealMemory=$mem/" <<<"$detected") State=UNKNOWN\\n"
  done
  local nodes default=YES
  nodes="$(IFS=,; echo "${NODE_NAMES[*]}")"
  PARTITION_LINES=""
  for name in ${PARTITION//,/ }; do
    PARTITION_LINES+="PartitionName=$name Nodes=$nodes Default=$default MaxTime=$MAX_TIME"
    PARTITION_LINES+="${DEFAULT_TIME:+ DefaultTime=$DEFAULT_TIME} State=UP\\n"
    default=NO
  done
  [[ -z "$VM_NODE" ]] || describe_vm_node
}

# The VM node and its partition, from the topology (tools/vm/boot.py --slurm-node); a job
# there gets the guest's memory per CPU by default, not the host's.
describe_vm_node() {
  local line cpus mem
  line="$(python3 "$REPO/tools/vm/boot.py" --slurm-node "$VM_NODE")" ||
    die "HPCMEM_SLURM_VM_NODE=$VM_NODE: not a topology of tools/vm/boot.py"
  cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$line")"
  mem="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$line")"
  NODE_LINES+="$line NodeAddr=127.0.0.1 Port=$VM_PORT State=UNKNOWN\\n"
  PARTITION_LINES+="PartitionName=$VM_PARTITION Nodes=$VM_NODE Default=NO MaxTime=$MAX_TIME"
  PARTITION_LINES+="${DEFAULT_TIME:+ DefaultTime=$DEFAULT_TIME} DefMemPerCPU=$((mem / cpus)) State=UP\\n"
}

# Configuration files, generated from this machine and the settings.
configure() {
  mkdir -p "$STATE"/{etc,run/slurm,log,state,spool,munge} "$MYSQL_DIR"
  # STATE/mysql is always where MariaDB's files are seen from: the folder, or a link to it
  [[ "$MYSQL_DIR" == "$STATE/mysql" ]] || ln -sfn "$MYSQL_DIR" "$STATE/mysql"
  chmod 700 "$STATE/munge" "$STATE/etc"
  if [[ ! -s "$STATE/etc/db.password" ]]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$STATE/etc/db.password")
  fi
  describe_nodes
  ((NODES == 1)) || write_hosts
  local edits
  if [[ -s "$STATE/etc/slurm.conf" ]] && ! edits="$(differences)"; then
    log "slurm.conf (stopped) differed from what the settings make; written anew:"
    echo "$edits" >&2
  fi
  render slurm.conf
  render slurmdbd.conf
  render cgroup.conf
  : >"$STATE/etc/plugstack.conf"
  chmod 600 "$STATE/etc/slurmdbd.conf"
  echo "export SLURM_CONF=$STATE/etc/slurm.conf" >"$STATE/env.sh"
  settings >"$STATE/etc/settings.env"
}

# Slurm 22.05 ignores AuthInfo=socket= on its persistent connections to slurmdbd, so
# munged serves the default socket. On one node any munged will do (credentials are
# encoded and decoded by the same daemon): reuse a running one, else start one for all.
munge_works() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }

start_munged() {
  if munge_works >/dev/null 2>&1; then
    return
  fi
  local key="$STATE/munge/munge.key"
  if [[ ! -s "$key" ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$key")
  fi
  mkdir -p "$(dirname "$MUNGE_SOCKET")"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --force --key-file="$key" --socket="$MUNGE_SOCKET" --pid-file="$MUNGE_PIDFILE" \
    --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed" \
    --num-threads=4 8>&- 9>&-
  wait_for munged munge_works
}

# The shared munged ends with the last Slurm daemon on the machine (any cluster's).
stop_munged() {
  local pid
  if pgrep -x 'slurmctld|slurmd|slurmdbd' >/dev/null 2>&1; then
    return
  fi
  for file in "$MUNGE_PIDFILE" "$STATE/run/munged.pid"; do
    [[ -s "$file" ]] || continue
    pid="$(tr -dc '0-9' <"$file")"
    if [[ -n "$pid" && "$(ps -o comm= -p "$pid" 2>/dev/null)" == munged ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      wait_for "munged (pid $pid) to stop" eval "! kill -0 $pid"
    fi
    rm -f "$file"
  done
}

mysql_client() {
  mariadb --no-defaults --socket="$MYSQL_DIR/mysqld.sock" -u root "$@"
}

# MariaDB's system tables made anew in $1, the output in STATE/log/mariadb-install-db.log.
install_db() {
  rm -rf "$1"
  mariadb-install-db --no-defaults --user=mysql --datadir="$1" --skip-test-db \
    --auth-root-authentication-method=socket >"$STATE/log/mariadb-install-db.log" 2>&1
}

start_mariadbd() {
  if ! daemon_pid mariadbd >/dev/null; then
    local data="$MYSQL_DIR/data"
    chown mysql:mysql "$MYSQL_DIR"
    runuser -u mysql -- test -w "$MYSQL_DIR" || die "the mysql user cannot write to $MYSQL_DIR"
    if [[ ! -d "$data/mysql" ]] && ! install_db "$data"; then
      # once more from nothing, the first try's log kept beside: a failure seen once
      # while other clusters and VM images were being built showed in no rerun
      mv "$STATE/log/mariadb-install-db.log" "$STATE/log/mariadb-install-db.first.log"
      log "mariadb-install-db failed; trying once more (log: $STATE/log/mariadb-install-db.first.log):"
      grep -E 'ERROR|FATAL|Neither|failed' "$STATE/log/mariadb-install-db.first.log" | head -n 8 >&2 || true
      install_db "$data" ||
        die "mariadb-install-db failed twice: see $STATE/log/mariadb-install-db.log, which says:
$(grep -E 'ERROR|FATAL|Neither|failed' "$STATE/log/mariadb-install-db.log" | head -n 8)"
    fi
    rm -f "$MYSQL_DIR/mysqld.sock"
    touch "$MARIADB_LOG"
    chown mysql:mysql "$MARIADB_LOG"
    [[ "$MARIADB_LOG" == "$STATE/log/mariadbd.log" ]] || ln -sfn "$MARIADB_LOG" "$STATE/log/mariadbd.log"
    # Start in its own session so the daemon outlives the caller's process group.
    setsid mariadbd --no-defaults --user=mysql --datadir="$data" \
      --socket="$MYSQL_DIR/mysqld.sock" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
      --skip-name-resolve --pid-file="$(pidfile mariadbd)" --log-error="$MARIADB_LOG" \
      --innodb-buffer-pool-size=32M --innodb-log-file-size=16M --performance-schema=OFF \
      </dev/null >/dev/null 2>&1 8>&- 9>&- &
    wait_for mariadbd mysql_client -e "SELECT 1"
  fi
  mysql_client <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$STATE/etc/db.password")';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
}

start_slurmdbd() {
  daemon_pid slurmdbd >/dev/null && return
  # slurmdbd reads slurmdbd.conf from the folder of $SLURM_CONF.
  SLURM_CONF="$STATE/etc/slurm.conf" slurmdbd 8>&- 9>&-
  wait_for slurmdbd sacctmgr -n list cluster
}

sacctmgr_list() { sacctmgr -n -P list "$@"; }

# The cluster, its account with root in it (root's default account), and the QOS.
register_cluster() {
  if [[ -z "$(sacctmgr_list cluster "$CLUSTER" format=cluster)" ]]; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  if [[ -z "$(sacctmgr_list account "$ACCOUNT" format=account)" ]]; then
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=hpcmem Organization=hpcmem >/dev/null
  fi
  if [[ -z "$(sacctmgr_list user root account="$ACCOUNT" withassoc format=account)" ]]; then
    sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
  fi
  sacctmgr -i modify user root set DefaultAccount="$ACCOUNT" >/dev/null 2>&1 || true
  [[ -n "$QOS" ]] || return 0
  if [[ -z "$(sacctmgr_list qos "$QOS" format=name)" ]]; then
    sacctmgr -i add qos "$QOS" >/dev/null
  fi
  if [[ -n "$QOS_LIMITS" ]]; then
    # shellcheck disable=SC2086  # one word per limit
    sacctmgr -i modify qos "$QOS" set $QOS_LIMITS >/dev/null
  fi
  if ! sacctmgr_list assoc user=root account="$ACCOUNT" format=qos | tr ',' '\n' | grep -qx "$QOS"; then
    sacctmgr -i modify user root where account="$ACCOUNT" set QOS+="$QOS" >/dev/null
  fi
}

node_idle() {
  local state
  state="$(sinfo -h -N -n "$1" -o %T 2>/dev/null)"
  [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]]
}

start_slurmctld() {
  daemon_pid slurmctld >/dev/null && return
  slurmctld -f "$STATE/etc/slurm.conf" 8>&- 9>&-
  wait_for slurmctld scontrol ping
}

# Start the slurmd of node $1 (a name of NODE_NAMES) unless it runs; wait until it is idle.
start_slurmd() {
  local name="$1"
  if ! daemon_pid "slurmd-$name" >/dev/null; then
    if ((NODES > 1)); then
      start_node_slurmd "${name#node}"
    else
      mkdir -p "$STATE/spool/slurmd-$name" /run/slurm
      # Configless (--conf-server): slurmd caches slurm.conf and links it as /run/slurm/conf,
      # where srun inside jobs finds it (snakemake's jobstep executor drops SLURM_CONF). In a
      # mount namespace of its own, that /run/slurm is STATE/run/slurm: each cluster's jobs
      # see their own cluster, whichever slurmd started last.
      unshare --mount --propagation private -- sh -c \
        'mount --bind "$1" /run/slurm && shift && exec "$@"' sh "$STATE/run/slurm" \
        slurmd -N "$name" --conf-server "$HOST:$CTLD_PORT" 8>&- 9>&-
    fi
  fi
  wait_for "node $name to become idle" node_idle "$name"
  # A node that was down in an earlier run (or lost with node-down) may come back drained
  # or down; resume it.
  if sinfo -h -N -n "$name" -o %T | grep -qE 'drain|down'; then
    scontrol update NodeName="$name" State=RESUME
    wait_for "node $name to resume" node_idle "$name"
  fi
}

# Run "$@" where the cluster's clients work: in the head namespace of a multi-node cluster.
on_login() {
  if ((NODES > 1)); then
    nsenter --net="/run/netns/$HEAD_NS" unshare --mount --uts --propagation private -- sh -c \
      'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
      sh "$HEAD_NAME" "$STATE/etc/hosts" "$@"
  else
    "$@"
  fi
}

# The daemons, from the login host (the head namespace of a multi-node cluster).
start_daemons() {
  export SLURM_CONF="$STATE/etc/slurm.conf"
  local name
  start_mariadbd
  start_slurmdbd
  register_cluster
  start_slurmctld
  for name in "${NODE_NAMES[@]}"; do start_slurmd "$name"; done
  wait_for sacct sacct -n -X -S now-1hours
}

# The lines in which STATE/etc/slurm.conf differs from what the settings make (diff's
# "<" for the file's, ">" for the settings'), at most 20; fails when there are any.
differences() {
  local wanted="$STATE/etc/slurm.conf.wanted" lines
  render slurm.conf "$wanted"
  lines="$(diff "$STATE/etc/slurm.conf" "$wanted" | grep '^[<>]' | head -n 20 || true)"
  rm -f "$wanted"
  [[ -z "$lines" ]] || { echo "$lines"; return 1; }
}

# The settings a running cluster was started with that these differ from, one a line.
changed_settings() {
  local running line
  running="$(cat "$STATE/etc/settings.env")"
  while read -r line; do
    grep -qxF -- "$line" <<<"$running" && continue
    local name="${line#export }"
    name="${name%%=*}"
    local was
    was="$(grep "^export $name=" <<<"$running" || echo "$name=")"
    echo "  $name: running with ${was#*=}, asked for ${line#*=}"
  done < <(settings)
}

# A running cluster keeps the configuration it started with: refuse to change it.
refuse_changes() {
  local changed=""
  [[ ! -s "$STATE/etc/settings.env" ]] || changed="$(changed_settings)"
  if [[ -z "$changed" ]]; then
    describe_nodes
    changed="$(differences)" && return 0
    changed="$(sed -e 's/^< /  slurm.conf has:    /' -e 's/^> /  settings make:     /' <<<"$changed")"
  fi
  log "error: the cluster in $STATE runs with another configuration; slurmctld keeps the" \
    "one it started with:"
  echo "$changed" >&2
  log "stop it and start it again to change it (its jobs are cancelled):" \
    "$0 stop $STATE && $0 start $STATE"
  exit 2
}

# One start or stop at a time on the machine, whatever the cluster: clusters share munged,
# which a stop ends when it sees no other Slurm daemon, so a start beside it could lose
# munged before its own daemons run.
machine_lock() {
  exec 8>"${HPCMEM_SLURM_MACHINE_LOCK:-/run/lock/hpcmem-slurm.lock}"
  flock 8
}

# Whether every daemon of the cluster runs (munged: any serving the socket).
all_up() {
  local name
  munge_works >/dev/null 2>&1 || return 1
  for name in "${DAEMONS[@]}"; do
    [[ $name == munged ]] || daemon_pid "$name" >/dev/null || return 1
  done
}

do_start() {
  check_tools
  if daemon_pid slurmctld >/dev/null; then
    refuse_changes
  fi
  all_up || machine_lock
  configure
  local begin=$SECONDS
  start_munged
  ((NODES == 1)) || net_up
  on_login "$0" start-daemons "$STATE"
  log "cluster '$CLUSTER' (${NODE_NAMES[*]}) up in $((SECONDS - begin))s (state and logs: $STATE)"
  cat "$STATE/env.sh"
}

# SIGTERM to every named daemon, wait for all of them, SIGKILL what is left after 15s.
stop_daemons() {
  local name pid entry deadline pids=()
  for name in "$@"; do
    if pid="$(daemon_pid "$name")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$name:$pid")
    fi
  done
  deadline=$((SECONDS + 15))
  for entry in "${pids[@]}"; do
    name="${entry%%:*}" pid="${entry##*:}"
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored SIGTERM for 15s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for name in "$@"; do rm -f "$(pidfile "$name")"; done
}

# Cancel the jobs (from the login host), then stop the daemons.
stop_jobs() {
  export SLURM_CONF="$STATE/etc/slurm.conf"
  scancel --full --user=root 2>/dev/null || true
  local deadline=$((SECONDS + 15))
  while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.3; done
}

do_stop() {
  [[ -d "$STATE" ]] || return 0
  machine_lock
  if daemon_pid slurmctld >/dev/null && daemon_pid "slurmd-${NODE_NAMES[0]}" >/dev/null &&
    { ((NODES == 1)) || ns_exists "$HEAD_NS"; }; then
    on_login "$0" stop-jobs "$STATE"
  fi
  # slurmctld keeps what slurmdbd cannot take any more in its state and sends it next start
  stop_daemons "${NODE_NAMES[@]/#/slurmd-}" slurmctld slurmdbd
  stop_daemons mariadbd
  ((NODES == 1)) || net_down
  stop_munged
  log "cluster stopped (logs kept in $STATE/log)"
}

# Node $1 loses power: its slurmd and every process it started die at once.
do_node_down() {
  local name="$1" pid
  [[ " ${NODE_NAMES[*]} " == *" $name "* ]] || die "node '$name' is not one of ${NODE_NAMES[*]}"
  ((NODES > 1)) || die "node-down needs a multi-node cluster (HPCMEM_SLURM_NODES > 1)"
  if pid="$(daemon_pid "slurmd-$name")"; then kill -KILL "$pid"; fi
  kill_node_processes "${name#node}"
  rm -f "$(pidfile "slurmd-$name")"
  log "node $name is down (slurmd and its jobs killed)"
}

do_node_up() {
  local name="$1"
  [[ " ${NODE_NAMES[*]} " == *" $name "* ]] || die "node '$name' is not one of ${NODE_NAMES[*]}"
  SLURM_CONF="$STATE/etc/slurm.conf" on_login "$0" start-node "$STATE" "$name"
  log "node $name is up"
}

# The key of the munged serving MUNGE_SOCKET: the one this script started (any cluster's),
# else the system's.
munge_key() {
  local file pid arg
  for file in "$MUNGE_PIDFILE" /run/munge/munged.pid; do
    [[ -s "$file" ]] || continue
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || continue
    while IFS= read -r -d '' arg; do
      [[ "$arg" != --key-file=* ]] || { echo "${arg#--key-file=}"; return; }
    done <"/proc/$pid/cmdline"
    echo /etc/munge/munge.key
    return
  done
  die "no munged of ours or the system's serves $MUNGE_SOCKET: start the cluster first"
}

# Boot the VM node with OUT as its /mnt/out and VM_OPTIONS for boot.py: it runs CMD ($@),
# then serves until OUT/stop.
do_vm_node() {
  local out
  [[ -n "$VM_NODE" ]] || die "the cluster in $STATE has no VM node (HPCMEM_SLURM_VM_NODE)"
  out="$(realpath -m "$1")"
  shift
  mkdir -p "$out"
  rm -f "$out/stop" "$out/command.rc" "$out/command.rc.part"
  install -m 600 "$(munge_key)" "$out/munge.key"
  exec python3 "$REPO/tools/vm/boot.py" --timeout "${HPCMEM_VM_TIMEOUT:-3600}" \
    --share-rw "$STATE/log" --host-port "$CTLD_PORT" --guest-port "$VM_PORT" "${VM_OPTIONS[@]}" \
    "$VM_NODE" "$out" -- sh tools/vm/guest/slurm-node.sh "$VM_NODE" "$CTLD_PORT" "$STATE" "$@" 8>&- 9>&-
}

do_status() {
  local name pid all=0
  for name in "${DAEMONS[@]}"; do
    if [[ $name == munged ]] && munge_works >/dev/null 2>&1; then
      echo "munged: running (shared, serving $MUNGE_SOCKET)"
    elif [[ $name != munged ]] && pid="$(daemon_pid "$name")"; then
      echo "$name: running (pid $pid)"
    else
      echo "$name: stopped"
      all=1
    fi
  done
  if ((all == 0)); then
    SLURM_CONF="$STATE/etc/slurm.conf" on_login sinfo -N -o '%N %T %c %m %P'
    [[ -z "$QOS$ENFORCE" ]] || echo "account $ACCOUNT, QOS ${QOS:-normal}, enforce ${ENFORCE:-none}"
  fi
  return "$all"
}

case "$ACTION" in
  # what start, stop and node-up run on the login host, under their lock
  start-daemons) start_daemons; exit ;;
  stop-jobs) stop_jobs; exit ;;
  start-node) export SLURM_CONF="$STATE/etc/slurm.conf"; start_slurmd "$3"; exit ;;
  login)
    shift
    [[ "${1:-}" == "--" ]] || shift  # DIR
    [[ "${1:-}" == "--" ]] || usage
    shift
    (($# > 0)) || usage
    SLURM_CONF="$STATE/etc/slurm.conf" on_login "$@"
    exit ;;
  node-down | node-up) [[ -n "${3:-}" ]] || usage ;;
  vm-node)
    [[ -n "${3:-}" ]] || usage
    out="$3"
    shift 3
    VM_OPTIONS=()
    while (($# > 0)) && [[ "$1" != "--" ]]; do VM_OPTIONS+=("$1"); shift; done
    (($# == 0)) || shift
    do_vm_node "$out" "$@" ;;
  start | stop | status) ;;
  *) usage ;;
esac
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
# One start/stop at a time per state dir (parallel test sessions share it); starts that start
# something and stops also take the machine's lock (machine_lock). Daemons are started with
# fds 8 and 9 closed so that they never hold a lock.
exec 9>"$STATE/.lock"
flock 9
case "$ACTION" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  node-down) do_node_down "$3" ;;
  node-up) do_node_up "$3" ;;
esac
