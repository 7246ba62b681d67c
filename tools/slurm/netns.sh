# Network namespaces of a multi-node test cluster; sourced by cluster.sh (HPCMEM_SLURM_NODES > 1).
#
# The head namespace NS_PREFIX"h" (the login and controller host "head") holds a bridge with
# SUBNET.1; node i is namespace NS_PREFIX"n<i>", joined to the bridge by a veth pair, with
# SUBNET.(10+i). The head runs MariaDB, slurmdbd and slurmctld; each node one slurmd in a
# mount and UTS namespace of its own (host name node<i>, STATE/etc/hosts as /etc/hosts,
# STATE/run/node<i>/slurm as /run/slurm, STATE/run/node<i>/tmp as TmpFS, STATE/tmp, and a
# /dev/shm of its own that node-down empties, as a power cut would). Every
# address lives inside these namespaces and nothing routes out of them; the names are unique
# per controller port. Clients (and the head's daemons) run through on_login: in the head's
# network namespace, with host name "head" and the cluster's /etc/hosts.

#: every address of the cluster is in SUBNET.0/24, inside the namespaces only
SUBNET=10.213.0
NS_PREFIX="hpcm${CTLD_PORT}"
HEAD_NS="${NS_PREFIX}h"
#: the head's host name, known in the cluster's /etc/hosts only
HEAD_NAME=head
BRIDGE="${NS_PREFIX}br"

node_ns() { echo "${NS_PREFIX}n$1"; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }

ns_exists() { ip netns list | grep -qw "^$1"; }

# Create what is missing: the head with its bridge, then each node with its veth pair.
net_up() {
  local i ns outer
  if ! ns_exists "$HEAD_NS"; then
    ip netns add "$HEAD_NS"
    ip -n "$HEAD_NS" link set lo up
    ip -n "$HEAD_NS" link add "$BRIDGE" type bridge
    ip -n "$HEAD_NS" addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip -n "$HEAD_NS" link set "$BRIDGE" up
  fi
  for ((i = 1; i <= NODES; i++)); do
    ns="$(node_ns "$i")" outer="${NS_PREFIX}h$i"
    ns_exists "$ns" && continue
    ip netns add "$ns"
    ip link add "$outer" type veth peer name "$ns"
    ip link set "$outer" netns "$HEAD_NS"
    ip link set "$ns" netns "$ns"
    ip -n "$HEAD_NS" link set "$outer" master "$BRIDGE"
    ip -n "$HEAD_NS" link set "$outer" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev "$ns"
    ip -n "$ns" link set "$ns" up
  done
}

# SIGKILL every process left in node i's namespace (job steps, ranks): as a power cut.
kill_node_processes() {
  local ns pids
  ns="$(node_ns "$1")"
  ns_exists "$ns" || return 0
  pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
  [[ -z "${pids// /}" ]] || kill -KILL $pids 2>/dev/null || true
}

# Remove every namespace of the cluster (the veth pairs and the bridge go with them).
net_down() {
  local i
  for ((i = 1; i <= NODES; i++)); do
    kill_node_processes "$i"
    ! ns_exists "$(node_ns "$i")" || ip netns del "$(node_ns "$i")"
  done
  ! ns_exists "$HEAD_NS" || ip netns del "$HEAD_NS"
}

# /etc/hosts of the head and the nodes (bound over /etc/hosts in their mount namespaces).
write_hosts() {
  local i
  {
    echo "127.0.0.1 localhost"
    echo "$SUBNET.1 $HEAD_NAME"
    for ((i = 1; i <= NODES; i++)); do echo "$(node_addr "$i") node$i"; done
  } >"$STATE/etc/hosts"
}

# slurmd of node i in its namespaces, configless from the controller on the bridge.
start_node_slurmd() {
  local name="node$1"
  mkdir -p "$STATE/spool/slurmd-$name" "$STATE/run/$name/slurm" "$STATE/run/$name/tmp" \
    "$TMP_FS" /run/slurm
  nsenter --net="/run/netns/$(node_ns "$1")" unshare --mount --uts --propagation private -- sh -c \
    'hostname "$1" && mount --bind "$2/slurm" /run/slurm && mount --bind "$2/tmp" "$3" &&
     mount --bind "$4" /etc/hosts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
     shift 4 && exec "$@"' \
    sh "$name" "$STATE/run/$name" "$TMP_FS" "$STATE/etc/hosts" \
    slurmd -N "$name" --conf-server "$ADDR:$CTLD_PORT" 8>&- 9>&-
}
