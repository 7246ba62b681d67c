#!/usr/bin/env python3
"""Boot a multi-NUMA test VM whose firmware (ACPI SRAT, SLIT and HMAT) describes a real
HBM or CXL layout, run one command in it and power it off.

    tools/vm/boot.py [--timeout SECONDS] [--share-rw PATH]... [--host-port PORT]...
                     [--guest-port PORT]... TOPOLOGY OUT -- COMMAND [ARG...]
    tools/vm/boot.py --slurm-node TOPOLOGY    # the guest as a slurm.conf node line

The image comes from tools/vm/build-image.sh (built once, cached). The checkout, its venv and
the venv's base interpreter are shared read-only at their host paths, so the guest runs
what was built here; each ``--share-rw`` PATH is shared read-write at its path. OUT
(read-write, /mnt/out in the guest) gets the guest's output: ``guest.log`` (the command's),
``rc`` (its exit status) and ``console.log``. The exit status is the command's, 124 when the
VM ran out of time, 125 when it never ran the command. The guest's host name is the
topology's, and its SMBIOS system product ``hpcmem-vm`` with the topology as version.

Without ports the guest has no network. ``--host-port PORT`` lets it reach the host's
127.0.0.1:PORT at HOST_ADDRESS:PORT, ``--guest-port PORT`` the host reach its PORT at
127.0.0.1:PORT: QEMU's user-mode network with ``restrict=on``, so nothing else leaves the
guest, and nothing but these forwards reaches it. QEMU emulates the CPUs (TCG) unless
HPCMEM_VM_ACCEL=kvm names a host with real VT-x/AMD-V.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("HPCMEM_VM_CACHE", Path.home() / ".cache" / "hpcmem" / "vm"))
QBOOT = Path("/usr/share/qemu/qboot.rom")  # faster to the kernel than SeaBIOS
#: where the guest reaches the host's forwarded ports, and its own address
HOST_ADDRESS = "10.0.2.100"
GUEST_ADDRESS = "10.0.2.15"


@dataclass(frozen=True)
class Node:
    """One NUMA node: its CPUs, memory in MiB and, for a CPU-less one, its initiator."""

    cpus: str | None
    mib: int
    initiator: int | None = None


@dataclass(frozen=True)
class Topology:
    """A NUMA layout as firmware describes it: nodes, SLIT distances and HMAT figures
    (initiator, target) -> (latency ns, bandwidth) for memory accessed from a CPU node."""

    name: str
    description: str
    smp: str
    nodes: tuple[Node, ...]
    distances: dict[tuple[int, int], int]
    hmat: dict[tuple[int, int], tuple[int, str]]
    #: what a site's slurm.conf says of such nodes (``Features=``)
    features: tuple[str, ...]

    def qemu_args(self) -> list[str]:
        """QEMU's -smp, -m, -object, -numa options for this layout."""
        args = ["-smp", self.smp, "-m", f"{sum(n.mib for n in self.nodes)}M"]
        for index, node in enumerate(self.nodes):
            args += ["-object", f"memory-backend-ram,id=m{index},size={node.mib}M"]
            spec = f"node,nodeid={index},memdev=m{index}"
            spec += f",cpus={node.cpus}" if node.cpus else ""
            spec += f",initiator={node.initiator}" if node.initiator is not None else ""
            args += ["-numa", spec]
        for (src, dst), value in self.distances.items():
            args += ["-numa", f"dist,src={src},dst={dst},val={value}"]
        for (initiator, target), (latency, bandwidth) in self.hmat.items():
            lb = f"hmat-lb,initiator={initiator},target={target},hierarchy=memory"
            args += ["-numa", f"{lb},data-type=access-latency,latency={latency}",
                     "-numa", f"{lb},data-type=access-bandwidth,bandwidth={bandwidth}"]
        return args

    def slurm_node(self) -> str:
        """This guest as a slurm.conf node line: its CPUs as slurmd finds them, a fifth of
        its memory left to the kernel, and its features."""
        cpus, *options = self.smp.split(",")
        layout = dict(option.split("=") for option in options)
        memory = sum(n.mib for n in self.nodes) * 4 // 5
        return (f"NodeName={self.name} CPUs={cpus} Boards=1 SocketsPerBoard={layout['sockets']} "
                f"CoresPerSocket={layout['cores']} ThreadsPerCore={layout['threads']} "
                f"RealMemory={memory} Feature={','.join(self.features)}")


TOPOLOGIES = {
    t.name: t
    for t in (
        Topology(
            "knl-flat",
            "Xeon Phi (KNL) in flat quadrant mode: cores on DDR node 0, MCDRAM as CPU-less node 1",
            "2,sockets=1,cores=2,threads=1",
            (Node("0-1", 1024), Node(None, 512, initiator=0)),
            {(0, 1): 31},
            {(0, 0): (100, "90G"), (0, 1): (130, "450G")},
            ("hbm", "flat", "quad"),
        ),
        Topology(
            "xeon-max-snc2",
            "Xeon Max in flat SNC-2 mode: per cluster a DDR node with 2 cores (0, 1) and a "
            "CPU-less HBM node (2, 3)",
            "4,sockets=2,cores=2,threads=1",
            (Node("0-1", 768), Node("2-3", 768), Node(None, 384, initiator=0),
             Node(None, 384, initiator=1)),
            {(0, 1): 21, (0, 2): 13, (0, 3): 23, (1, 2): 23, (1, 3): 13, (2, 3): 23},
            {(0, 0): (100, "100G"), (0, 1): (150, "50G"), (0, 2): (130, "400G"),
             (0, 3): (180, "200G"), (1, 0): (150, "50G"), (1, 1): (100, "100G"),
             (1, 2): (180, "200G"), (1, 3): (130, "400G")},
            ("hbm", "flat", "snc2"),
        ),
        Topology(
            "cxl-expander",
            "a server with a CXL memory expander: node 0 = 2 cores + 1 GiB DDR, node 1 = "
            "512 MiB CPU-less CXL memory, slower and farther than DDR",
            "2,sockets=1,cores=2,threads=1",
            (Node("0-1", 1024), Node(None, 512, initiator=0)),
            {(0, 1): 24},
            {(0, 0): (100, "100G"), (0, 1): (250, "30G")},
            ("cxl",),
        ),
    )
}


@dataclass(frozen=True)
class Network:
    """The ports forwarded between host and guest (none: the guest has no network)."""

    host_ports: tuple[int, ...] = ()
    guest_ports: tuple[int, ...] = ()

    def qemu_args(self) -> list[str]:
        """QEMU's user-mode network with these forwards and nothing else, or no NIC."""
        if not self.host_ports and not self.guest_ports:
            return ["-nic", "none"]
        spec = "user,id=net0,restrict=on,net=10.0.2.0/24"
        spec += "".join(f",hostfwd=tcp:127.0.0.1:{port}-{GUEST_ADDRESS}:{port}"
                        for port in self.guest_ports)
        # one socat per connection the guest opens, to the host's loopback only
        spec += "".join(f",guestfwd=tcp:{HOST_ADDRESS}:{port}-cmd:socat STDIO TCP:127.0.0.1:{port}"
                        for port in self.host_ports)
        return ["-netdev", spec, "-device", "virtio-net-pci,netdev=net0"]


def image() -> Path:
    """The cached boot image (built now when missing; one build at a time per cache),
    marked used (the builder removes images no boot has used for two weeks)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([str(HERE / "build-image.sh"), str(CACHE)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"boot.py: the VM image could not be built: {done.stderr.strip()}")
        path = Path(done.stdout.strip().splitlines()[-1])
        (path / "used").touch()
    return path


def shared_paths() -> list[Path]:
    """The checkout, the venv and its base interpreter: what the guest needs at host paths
    (the root's /usr has Debian's own Python)."""
    paths: list[Path] = []
    for path in (REPO, Path(sys.prefix), Path(sys.base_prefix)):
        path = path.resolve()
        if path.is_relative_to(Path("/usr")) or any(path.is_relative_to(p) for p in paths):
            continue
        paths = [p for p in paths if not p.is_relative_to(path)] + [path]
    return paths


def git_sha() -> str:
    """The checkout's commit, as records name it (``-dirty`` with changes to tracked files)."""
    git = ["git", "-C", str(REPO)]
    done = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        return "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return done.stdout.strip() + ("-dirty" if dirty else "")


def guest_environment() -> dict[str, str]:
    """What the command runs with inside: the venv first on PATH, where the host is."""
    return {
        "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HPCMEM_VM_HOST_ADDRESS": HOST_ADDRESS,
        "HPCMEM_GIT_SHA": os.environ.get("HPCMEM_GIT_SHA") or git_sha(),
        "PYTHONDONTWRITEBYTECODE": "1",  # the checkout is read-only in the guest
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
    }


def qemu_command(topology: Topology, boot: Path, out: Path, writable: tuple[Path, ...] = (),
                 network: Network = Network()) -> list[str]:
    """The QEMU command line: ``writable`` paths shared read-write after the read-only ones
    (so one may lie inside the checkout), ``network`` its forwards."""
    accel = os.environ.get("HPCMEM_VM_ACCEL", "tcg")
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else [
        "-accel", "tcg,thread=multi,tb-size=512", "-cpu", "max"]
    fs = [("rootfs", boot / "rootfs", True), ("out", out, False)]
    fs += [(f"share{i}", path, True) for i, path in enumerate(shared_paths())]
    fs += [(f"rwshare{i}", path, False) for i, path in enumerate(writable)]
    devices: list[str] = []
    for index, (tag, path, readonly) in enumerate(fs):
        ro = ",readonly=on" if readonly else ""
        devices += ["-fsdev", f"local,id=fs{index},path={path},security_model=none{ro},"
                    "multidevs=remap",
                    "-device", f"virtio-9p-pci,fsdev=fs{index},mount_tag={tag}"]
    shares = " ".join(f"vm.{tag}={path}" for tag, path, _ in fs if "share" in tag)
    net = f" vm.net={GUEST_ADDRESS}/24" if network.host_ports or network.guest_ports else ""
    append = (f"console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rdinit=/init "
              f"vm.init={HERE / 'guest' / 'init.sh'} vm.hostname={topology.name}{net} {shares}")
    bios = ["-bios", str(QBOOT)] if QBOOT.exists() else []
    smbios = f"type=1,manufacturer=hpcmem,product=hpcmem-vm,version={topology.name}"
    return ["qemu-system-x86_64", "-name", f"hpcmem-{topology.name}", "-nodefaults",
            "-no-user-config", "-nographic", "-machine", "pc,hmat=on", *cpu,
            *topology.qemu_args(), *bios, "-smbios", smbios, "-kernel", str(boot / "vmlinux"),
            "-initrd", str(boot / "initrd.gz"), "-append", append, *devices,
            *network.qemu_args(), "-serial", "file:" + str(out / "console.log"), "-no-reboot"]


def boot_and_run(topology: Topology, out: Path, command: list[str], timeout: float,
                 writable: tuple[Path, ...] = (), network: Network = Network()) -> int:
    """Boot ``topology``, run ``command`` in it with OUT at /mnt/out; its exit status."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("rc", "guest.log", "console.log"):
        (out / stale).unlink(missing_ok=True)
    environment = guest_environment()
    (out / "guest.env").write_text("".join(f"{k}={shlex.quote(v)}\n"
                                           for k, v in environment.items()))
    (out / "guest-command").write_text(f"cd {shlex.quote(str(REPO))} && {shlex.join(command)}\n")
    qemu = qemu_command(topology, image(), out, writable, network)
    started = time.monotonic()
    try:
        subprocess.run(qemu, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"boot.py: {topology.name}: no power-off within {timeout:.0f} s", file=sys.stderr)
        return 124
    seconds = time.monotonic() - started
    rc = out / "rc"
    status = int(rc.read_text()) if rc.exists() else 125
    print(f"boot.py: {topology.name}: rc={status} in {seconds:.1f} s", file=sys.stderr)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("topology", choices=sorted(TOPOLOGIES))
    parser.add_argument("out", type=Path, nargs="?",
                        help="folder for the guest's output (/mnt/out)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("--share-rw", type=Path, action="append", default=[], metavar="PATH",
                        help="share PATH read-write at its path (repeatable)")
    parser.add_argument("--host-port", type=int, action="append", default=[], metavar="PORT",
                        help=f"the host's 127.0.0.1:PORT at {HOST_ADDRESS}:PORT in the guest")
    parser.add_argument("--guest-port", type=int, action="append", default=[], metavar="PORT",
                        help="the guest's PORT at 127.0.0.1:PORT on the host")
    parser.add_argument("--slurm-node", action="store_true",
                        help="print the topology as a slurm.conf node line and exit")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    topology = TOPOLOGIES[args.topology]
    if args.slurm_node:
        print(topology.slurm_node())
        return 0
    if args.out is None or not command:
        parser.error("give OUT and, after --, the command to run in the guest")
    network = Network(tuple(args.host_port), tuple(args.guest_port))
    writable = tuple(path.resolve() for path in args.share_rw)
    return boot_and_run(topology, args.out.resolve(), command, args.timeout, writable, network)


if __name__ == "__main__":
    sys.exit(main())
