#!/bin/sh
# The guest as a compute node of the host's test cluster (`tools/slurm/cluster.sh vm-node`
# boots it so): munged with the host's key (/mnt/out/munge.key), the controller's port on the
# guest's loopback relayed to the host's, slurmd configless from it; then COMMAND, if any
# (its exit status then in /mnt/out/command.rc); then it serves jobs until the host creates
# /mnt/out/stop. Exit status: COMMAND's.
#
#   sh tools/vm/guest/slurm-node.sh NODE CTLD_PORT STATE [COMMAND...]
set -eu
node=$1 port=$2 state=$3
shift 3
install -d -m 700 /run/munge && install -m 600 /mnt/out/munge.key /run/munge/munge.key
munged --force --key-file=/run/munge/munge.key --log-file=/run/munge/munged.log \
  --seed-file=/run/munge/munged.seed
# slurm.conf names the controller at 127.0.0.1, the host's loopback: relay the guest's there
socat TCP-LISTEN:"$port",bind=127.0.0.1,reuseaddr,fork TCP:"$HPCMEM_VM_HOST_ADDRESS:$port" &
# slurmd's spool (unix sockets) and pid file on the guest's RAM; its log on the host's STATE/log
for dir in spool run; do
  mkdir -p "$state/$dir" && mount -t tmpfs tmpfs "$state/$dir"
done
slurmd -N "$node" --conf-server "127.0.0.1:$port"
echo "slurm-node: slurmd of $node started"
rc=0
[ $# -eq 0 ] || "$@" || rc=$?
# whole or not at all: the host polls for it
echo $rc >/mnt/out/command.rc.part && mv /mnt/out/command.rc.part /mnt/out/command.rc
until [ -e /mnt/out/stop ]; do sleep 1; done
kill "$(cat "$state/run/slurmd-$node.pid")"
exit $rc
