#!/usr/bin/env bash
# Build the cached boot image of the multi-NUMA test VMs once: the Debian 12 kernel (its
# uncompressed vmlinux, which QEMU boots through the PVH entry), a busybox initramfs that
# mounts a root directory shared over virtio-9p under a RAM overlay, and that root,
# debootstrapped with what the guest checks need (Python 3.11, numactl, hwloc, memkind,
# Open MPI) and what makes it a Slurm compute node (slurmd, srun, munge, socat). The checkout
# and its venv are not in the image: the guest mounts them read-only at their host path, so
# it runs exactly what was built here.
#
# Usage: tools/vm/build-image.sh [CACHE]   (default $HPCMEM_VM_CACHE or ~/.cache/hpcmem/vm)
# Idempotent: a finished image returns at once; a recipe change (this script, the guest
# init) builds a new one beside it (checkouts of other branches share the cache), and an
# image no boot has used for two weeks is removed. About 3 minutes and 850 MB the first
# time. Needs root (debootstrap), the Debian packages qemu-system-x86 busybox-static
# debootstrap cpio kmod, and Debian's mirror.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # debootstrap, depmod and chroot live there
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${HPCMEM_VM_CACHE:-$HOME/.cache/hpcmem/vm}}
recipe=$(cat "$0" "$here/guest/initramfs-init.sh" "$here/extract_vmlinux.py" | sha256sum | cut -c1-16)
image=$cache/image-$recipe
[[ -f $image/done ]] && { echo "$image"; exit 0; }
[[ $(id -u) -eq 0 ]] || { echo "build-image.sh: debootstrap needs root" >&2; exit 1; }
for tool in qemu-system-x86_64 debootstrap busybox cpio depmod; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool missing: run make setup" >&2; exit 1; }
done
mirror=${HPCMEM_VM_MIRROR:-http://deb.debian.org/debian}
rm -rf "$image" && mkdir -p "$image/debs"
exec 3>&1 >"$image/build.log" 2>&1  # the log keeps the detail, stdout the image's path

# 1. kernel: Debian 12's own (CONFIG_ACPI_HMAT, HMEM_REPORTING), 9p and overlay as modules
package=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
(cd "$image/debs" && apt-get download "$package")
dpkg-deb -x "$image"/debs/"${package}"_*.deb "$image/kernel"
release=${package#linux-image-}
depmod -b "$image/kernel" "$release"
python3 "$here/extract_vmlinux.py" "$image"/kernel/boot/vmlinuz-"$release" "$image/vmlinux"

# 2. initramfs: static busybox, the virtio/9p/overlay/network modules and our /init
work=$(mktemp -d)
mkdir -p "$work"/{bin,proc,sys,dev,lower,upper,newroot,lib/modules}
cp "$(command -v busybox)" "$work/bin/busybox"
modules="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p overlay failover net_failover virtio_net"
for module in $modules; do
  cp "$(find "$image/kernel/lib/modules/$release" -name "$module.ko*" | head -1)" "$work/lib/modules/"
done
echo "$modules" >"$work/lib/modules/order"
cp "$here/guest/initramfs-init.sh" "$work/init" && chmod +x "$work/init"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) >"$image/initrd.gz"
rm -rf "$work"

# 3. root: debootstrap minbase and the guest's packages (Debian's Python 3.11 for a venv made
# from it; an interpreter elsewhere, such as pyenv's, is shared read-only like the venv)
packages=python3,numactl,hwloc-nox,libhwloc15,libnuma1,libmemkind0,openmpi-bin,libopenmpi3,libpmix2,procps,kmod
# a Slurm compute node of the host's test cluster: Debian 12's Slurm, as on the host
packages+=,slurmd,slurm-client,munge,socat
# what the shared libraries of an interpreter built elsewhere (pyenv) load
packages+=,libffi8,libssl3,libbz2-1.0,libsqlite3-0,libreadline8,libncursesw6,libexpat1,libtirpc3,libnsl2,libuuid1
debootstrap --variant=minbase --include="$packages" bookworm "$image/rootfs" "$mirror"
chroot "$image/rootfs" apt-get clean
# Slurm's PMIx plugin opens libpmix.so, the link libpmix-dev makes (that package pulls in a
# toolchain)
ln -s libpmix.so.2 "$image/rootfs/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so"
touch "$image/done"
# boot.py touches `used` at every boot; `done` stands in for it in an image never booted
for old in "$cache"/image-*; do
  [[ $old == "$image" || -n $(find "$old" -maxdepth 1 \( -name used -o -name done \) -mtime -14) ]] ||
    rm -rf "$old"
done
echo "$image" >&3
