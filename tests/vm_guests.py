"""The test VMs of tests/test_vm_topologies.py: every topology booted once, when its tests
first ask for it, one of them as a compute node of a test Slurm cluster of its own.

Each guest runs tools/vm/guest/checks.py. One boots at a time: guest work is CPU-bound
emulation, and guests side by side on 2 cores take longer in all than one after the other
(a guest whose virtual CPUs wait for host time spins in its kernel's locks). The topology
:data:`SLURM_NODE` boots through ``cluster.sh vm-node``: its slurmd registers with the
cluster under ``.slurm-vm/`` (ports above the session cluster's, ``HPCMEM_SLURM_PORT`` + 9),
whose partition ``hbm`` is that guest alone; the guest runs the checks (not the plan: a
Slurm job runs that there) and serves jobs until it is stopped. Without Slurm here it boots
as the others do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from slurm_cluster import CLUSTER_SH, SITE, SlurmCluster, session_cluster

REPO = Path(__file__).resolve().parents[1]
BOOT = REPO / "tools" / "vm" / "boot.py"
GUEST_CHECKS = REPO / "tools" / "vm" / "guest" / "checks.py"
CHECKS = ["python", str(GUEST_CHECKS.relative_to(REPO)), "/mnt/out/checks.json"]
#: what boots the VMs and builds their image (Debian qemu-system-x86, debootstrap,
#: busybox-static, cpio, kmod) and forwards the Slurm node's ports (socat)
TOOLS = ("qemu-system-x86_64", "debootstrap", "busybox", "cpio", "depmod", "socat")
#: what the VM node's test cluster needs besides (tools/slurm/cluster.sh checks the rest)
SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "mariadbd")
#: the topology that is a Slurm compute node
SLURM_NODE = "xeon-max-snc2"
#: seconds for one boot and its checks (and for the Slurm node, its jobs) on a loaded host
#: (make test runs other tests beside them: the slowest guest took 290 s so, 150 s alone)
GUEST_SECONDS = 600
VM_STATE_DIR = Path(os.environ.get("HPCMEM_SLURM_VM_STATE", REPO / ".slurm-vm"))

__all__ = ["GUEST_SECONDS", "SLURM_NODE", "Fleet", "Guest", "guest_checks", "slurm_unsupported",
           "unsupported"]


def _missing(tools: tuple[str, ...]) -> str | None:
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"  # debootstrap and depmod live there
    return next((tool for tool in tools if shutil.which(tool, path=path) is None), None)


def unsupported() -> str | None:
    """Why QEMU test VMs cannot run here, or None."""
    if os.environ.get("HPCMEM_VM_TESTS") == "0":
        return "HPCMEM_VM_TESTS=0"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"the VM tests need an x86_64 Linux host, not {platform.machine()}"
    if tool := _missing(TOOLS):
        return f"{tool} not installed (tools/system-packages.txt: run `make setup`)"
    if os.geteuid() != 0:
        return "building the VM image (debootstrap) needs root"
    return None


def slurm_unsupported() -> str | None:
    """Why the VM cannot be a Slurm node here, or None."""
    if tool := _missing(SLURM_TOOLS):
        return f"{tool} not installed (tools/system-packages.txt: run `make setup`)"
    return None


@cache
def guest_checks() -> ModuleType:
    """tools/vm/guest/checks.py as a module (its summaries serve the host's tests too)."""
    spec = importlib.util.spec_from_file_location("vm_guest_checks", GUEST_CHECKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vm_cluster_env() -> dict[str, str]:
    """cluster.sh settings of the VM node's cluster: the site's, with partition batch on this
    host and hbm on the guest, and ports of its own."""
    port = int(os.environ.get("HPCMEM_SLURM_PORT", "16817")) + 9
    mysql_port = int(os.environ.get("HPCMEM_SLURM_MYSQL_PORT", "16306")) + 3
    return {**SITE, "HPCMEM_SLURM_PARTITION": "batch", "HPCMEM_SLURM_VM_NODE": SLURM_NODE,
            "HPCMEM_SLURM_PORT": str(port), "HPCMEM_SLURM_MYSQL_PORT": str(mysql_port),
            "HPCMEM_VM_TIMEOUT": str(GUEST_SECONDS + 600),
            # boot.py shares the venv of the python3 that runs it
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


@dataclass
class Guest:
    """One booted VM: its topology, its /mnt/out, and the process that runs it."""

    topology: str
    out: Path
    process: subprocess.Popen
    started: float
    found: dict[str, Any] | None = None

    def checks(self) -> dict[str, Any]:
        """What checks.py found, once it has run (AssertionError with the guest's log when
        it failed); ``host_seconds``: from the boot until then."""
        if self.found is not None:
            return self.found
        deadline = self.started + GUEST_SECONDS
        while (status := self._status()) is None and self.process.poll() is None:
            assert time.monotonic() < deadline, f"{self.topology}: no result in {GUEST_SECONDS} s"
            time.sleep(1)
        seconds = round(time.monotonic() - self.started, 1)
        status = status or self._status() or "none"
        log = self.out / "guest.log"
        assert status == "0", (f"{self.topology}: exit {status}, boot {self.process.poll()}\n"
                               + (log.read_text()[-4000:] if log.exists() else ""))
        checks = json.loads((self.out / "checks.json").read_text())
        checks["host_seconds"] = seconds
        print(f"{self.topology}: {seconds} s on the host, guest {checks['seconds']}")
        self.found = checks
        return checks

    def _status(self) -> str | None:
        """The guest command's exit status once written (a file the guest is still writing
        reads empty), or None."""
        for path in (self.out / "command.rc", self.out / "rc"):
            if path.exists() and (text := path.read_text().strip()):
                return text
        return None

    def stop(self) -> None:
        """Ask a guest that serves Slurm jobs to power off; end the VM (its QEMU too, which
        runs in the boot's process group) if it has not within a minute."""
        (self.out / "stop").touch()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _start(topology: str, out: Path, command: list[str], env: dict[str, str] | None = None
           ) -> Guest:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "boot.log").open("w") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=log, env=env, cwd=REPO, start_new_session=True)
    return Guest(topology, out, process, time.monotonic())


class Fleet:
    """The guests of a test module: each booted by :meth:`checks` the first time, the one
    before ended first; the Slurm node's cluster started while the first guest runs."""

    def __init__(self, folders: Any, stack: ExitStack) -> None:
        #: ``folders(name)`` makes a new folder (pytest's ``tmp_path_factory.mktemp``)
        self._folders = folders
        self._stack = stack
        self.guests: dict[str, Guest] = {}
        #: the Slurm node's cluster once started (None without Slurm here), and the scratch
        #: folder it shares with this host
        self.cluster: SlurmCluster | None = None
        self.scratch = folders("scratch")

    def _cluster(self) -> SlurmCluster | None:
        """The Slurm node's cluster, started the first time; None without Slurm here."""
        if self.cluster is None and not slurm_unsupported():
            self._stack.enter_context(session_cluster(VM_STATE_DIR, _vm_cluster_env()))
            self.cluster = SlurmCluster(VM_STATE_DIR, partition="batch", other_partition="hbm")
        return self.cluster

    def _boot(self, topology: str) -> Guest:
        out = self._folders(topology)
        if topology != SLURM_NODE or self._cluster() is None:
            guest = _start(topology, out, [sys.executable, str(BOOT), "--timeout",
                                           str(GUEST_SECONDS), topology, str(out), "--", *CHECKS])
            self._cluster()  # started while that guest runs
            return guest
        command = [str(CLUSTER_SH), "vm-node", str(VM_STATE_DIR), str(out),
                   "--share-rw", str(self.scratch), "--", *CHECKS, "--no-plan"]
        return _start(topology, out, command, {**os.environ, **_vm_cluster_env()})

    def checks(self, topology: str) -> dict[str, Any]:
        """What checks.py found in ``topology``'s guest, booting it first when it is new."""
        if topology not in self.guests:
            for other in self.guests.values():
                other.stop()
            self.guests[topology] = self._boot(topology)
        return self.guests[topology].checks()

    def stop(self) -> None:
        """End every guest."""
        for guest in self.guests.values():
            guest.stop()
