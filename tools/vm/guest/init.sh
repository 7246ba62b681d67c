#!/bin/sh
# PID 1 of the test VM after the initramfs: mount what programs expect, take the
# environment the host wrote (/mnt/out/guest.env), run /mnt/out/guest-command, keep its
# exit status in /mnt/out/rc and power off. The console shows GUEST_UP and GUEST_DONE.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
echo "GUEST_UP uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "127.0.1.1 $(hostname)" >>/etc/hosts  # munged and MPI look their host up
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
# cgroup v1 (as on the host's test cluster): slurmd loads its cgroup plugin, and v2's wants systemd
mount -t tmpfs cgroup /sys/fs/cgroup
for controller in cpuset memory freezer devices none,name=systemd; do
  folder=/sys/fs/cgroup/${controller#none,name=}
  mkdir "$folder" && mount -t cgroup -o "$controller" cgroup "$folder"
done
set -a; . /mnt/out/guest.env; set +a
sh /mnt/out/guest-command >/mnt/out/guest.log 2>&1
rc=$?
echo $rc >/mnt/out/rc
echo "GUEST_DONE rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
echo o >/proc/sysrq-trigger  # power off (the root has no init system to ask)
sleep 10
exit 1  # PID 1 gone: the kernel panics and QEMU (-no-reboot) ends
