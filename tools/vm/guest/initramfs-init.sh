#!/bin/busybox sh
# PID 1 of the test VM's initramfs: load the virtio/9p/overlay/network modules, mount the
# shared root read-only under a RAM overlay, mount each vm.shareN=PATH tag read-only and each
# vm.rwshareN=PATH tag read-write at PATH and the out tag read-write at /mnt/out, take the
# host name vm.hostname, give the first network interface vm.net=ADDRESS/PREFIX when asked,
# then switch to the root and run vm.init there.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
ip link set lo up  # MPI's launcher listens on loopback; the root has no ip command
for module in $(cat /lib/modules/order); do
  insmod /lib/modules/"$module".ko* || echo "initramfs: insmod $module failed"
done
options=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $options,ro,cache=loose rootfs /lower || { echo "initramfs: no 9p root"; poweroff -f; }
mount -t tmpfs -o size=50% tmpfs /upper && mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot
# RAM for /tmp and /run first, so that a share below them is not hidden
mount -t tmpfs tmpfs /newroot/tmp; mount -t tmpfs tmpfs /newroot/run
init=/bin/sh
for arg in $(cat /proc/cmdline); do
  case $arg in
    vm.share*=*) tag=${arg%%=*}; tag=${tag#vm.}; path=${arg#*=}
                 mkdir -p "/newroot$path" && mount -t 9p -o $options,ro,cache=loose "$tag" "/newroot$path" ;;
    vm.rwshare*=*) tag=${arg%%=*}; tag=${tag#vm.}; path=${arg#*=}
                   mkdir -p "/newroot$path" && mount -t 9p -o $options "$tag" "/newroot$path" ;;
    vm.hostname=*) hostname "${arg#vm.hostname=}" ;;
    vm.net=*) ip addr add "${arg#vm.net=}" dev eth0 && ip link set eth0 up ;;
    vm.init=*) init=${arg#vm.init=} ;;
  esac
done
mkdir -p /newroot/mnt/out && mount -t 9p -o $options out /newroot/mnt/out
for dir in proc sys dev; do mount --move /$dir /newroot/$dir; done
exec switch_root /newroot "$init"
