"""What this node offers hpcmem: NUMA nodes, HBW and DAX KMEM nodes (and how they were
found), the HBW placement backend (UMF or memkind), GPUs, the MPI library, Slurm, a container
runtime and the image this process runs in.

Nothing here is required: a missing piece is reported as such, never raised.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from hpcmem import __version__
from hpcmem.node import topology

__all__ = [
    "CONTAINER_DIGEST_ENV",
    "CONTAINER_IMAGE_ENV",
    "CONTAINER_RUNTIME_ENV",
    "CONTAINER_RUNTIME_VERSION_ENV",
    "collect",
    "container_info",
    "current_container",
    "dax_kmem_info",
    "gpu_info",
    "hbw_backend_info",
    "hbw_info",
    "mpi_info",
    "mpi_library",
    "numa_info",
    "parse_nvidia_smi",
    "slurm_info",
]

#: set by the workflow in a job that runs in an image: the image, its digest, the runtime
#: and the runtime's version
CONTAINER_IMAGE_ENV = "HPCMEM_CONTAINER_IMAGE"
CONTAINER_DIGEST_ENV = "HPCMEM_CONTAINER_DIGEST"
CONTAINER_RUNTIME_ENV = "HPCMEM_CONTAINER_RUNTIME"
CONTAINER_RUNTIME_VERSION_ENV = "HPCMEM_CONTAINER_RUNTIME_VERSION"
#: seconds a probing command (nvidia-smi, sinfo, apptainer) may take
TIMEOUT_S = 10


def _command(*argv: str) -> tuple[bool, str]:
    """(succeeded, stdout or the last line of stderr) of a short command."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        return False, str(error)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        return False, lines[-1]
    return True, done.stdout.strip()


def numa_info() -> list[dict[str, Any]]:
    """The NUMA nodes with CPUs, memory in bytes and, where HMAT gives them, the read
    bandwidth (MB/s) and latency (ns) from the nearest initiator."""
    return [
        {
            "id": node.id,
            "cpus": list(node.cpus),
            "memory_total_bytes": node.memory_total,
            "memory_free_bytes": node.memory_free,
            "memory_only": node.memory_only,
            "read_bandwidth_MBps": node.read_bandwidth_MBps,
            "read_latency_ns": node.read_latency_ns,
        }
        for node in topology.numa_nodes()
    ]


def hbw_info() -> dict[str, Any]:
    """The HBW nodes and how they were found (an invalid MEMKIND_HBW_NODES is reported)."""
    try:
        found = topology.hbw_nodes()
    except ValueError as error:
        return {"nodes": [], "source": None, "emulated": None, "error": str(error)}
    return {"nodes": list(found.nodes), "source": found.source, "emulated": found.emulated}


def dax_kmem_info() -> dict[str, Any]:
    """The DAX KMEM nodes, the slow tier, and how they were found (an invalid declaration is
    reported)."""
    try:
        nodes, source = topology.dax_kmem_nodes()
    except ValueError as error:
        return {"nodes": [], "source": None, "error": str(error)}
    return {"nodes": list(nodes), "source": source}


def hbw_backend_info() -> dict[str, Any]:
    """The backend hpcmem._hbw serves the kinds with (name, version), or why there is none."""
    from hpcmem.hbw.native import BackendNotBuiltError, backend

    try:
        return backend().to_record()
    except (BackendNotBuiltError, ValueError) as error:
        return {"name": None, "version": None, "error": str(error)}


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total,driver_version
    --format=csv,noheader,nounits`` (memory in MiB; ``[N/A]`` becomes None)."""
    gpus = []
    for line in text.splitlines():
        index, _, rest = line.partition(",")
        name, memory_mib, driver = (field.strip() for field in rest.rsplit(",", 2))
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "memory_total_bytes": int(memory_mib) << 20 if memory_mib.isdigit() else None,
                "driver": driver,
            }
        )
    return gpus


def gpu_info() -> list[dict[str, Any]]:
    """GPUs from nvidia-smi, else from torch when an NVIDIA driver is loaded."""
    if shutil.which("nvidia-smi"):
        ok, out = _command(
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        )
        if ok:
            return parse_nvidia_smi(out)
    if not Path("/proc/driver/nvidia").exists():
        return []
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "memory_total_bytes": torch.cuda.get_device_properties(i).total_memory,
            "driver": None,
        }
        for i in range(torch.cuda.device_count())
    ]


def mpi_library() -> str:
    """The first line of ``MPI_Get_library_version`` of the MPI that mpi4py is built on."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()


def mpi_info() -> dict[str, Any]:
    """The MPI library mpi4py is built on, without initialising MPI."""
    try:
        import mpi4py
    except ImportError:
        return {"mpi4py": None, "library": None, "error": "mpi4py not installed"}
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    major, minor = MPI.Get_version()
    return {
        "mpi4py": mpi4py.__version__,
        "library": mpi_library(),
        "standard": f"{major}.{minor}",
    }


def slurm_info() -> dict[str, Any]:
    """Slurm's client version and the job this process runs in."""
    job = os.environ.get("SLURM_JOB_ID")
    if not shutil.which("sinfo"):
        return {"installed": False, "version": None, "job_id": job}
    ok, out = _command("sinfo", "--version")
    info: dict[str, Any] = {"installed": True, "version": None, "job_id": job}
    if ok:
        info["version"] = out.split()[-1]
    else:
        info["error"] = f"sinfo --version: {out}"
    return info


def current_container() -> dict[str, str | None] | None:
    """The image this process runs in, as every record names it, or None (natively).

    The workflow exports ``HPCMEM_CONTAINER_IMAGE``, ``HPCMEM_CONTAINER_DIGEST``,
    ``HPCMEM_CONTAINER_RUNTIME`` and ``HPCMEM_CONTAINER_RUNTIME_VERSION``; otherwise
    Apptainer's own ``APPTAINER_CONTAINER`` (or Singularity's) names the image, with an
    empty digest.
    """
    if image := os.environ.get(CONTAINER_IMAGE_ENV):
        return {
            "image": image,
            "digest": os.environ.get(CONTAINER_DIGEST_ENV, ""),
            "runtime": os.environ.get(CONTAINER_RUNTIME_ENV),
            "runtime_version": os.environ.get(CONTAINER_RUNTIME_VERSION_ENV),
        }
    for variable in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        if image := os.environ.get(variable):
            return {"image": image, "digest": ""}
    return None


def container_info() -> dict[str, Any]:
    """An Apptainer/Singularity runtime on PATH, and the image this runs in, if any."""
    inside = (current_container() or {}).get("image")
    for name in ("apptainer", "singularity"):
        if shutil.which(name):
            ok, out = _command(name, "--version")
            version = out.split()[-1] if ok and out else None
            return {"runtime": name, "version": version, "inside": inside}
    return {"runtime": None, "version": None, "inside": inside}


def collect() -> dict[str, Any]:
    """Everything known about this node, as one JSON-ready dict (``hpcmem info --json``)."""
    return {
        "host": socket.gethostname(),
        "hpcmem": __version__,
        "numa_nodes": numa_info(),
        "hbw": hbw_info(),
        "dax_kmem": dax_kmem_info(),
        "hbw_backend": hbw_backend_info(),
        "gpus": gpu_info(),
        "mpi": mpi_info(),
        "slurm": slurm_info(),
        "container": container_info(),
    }
