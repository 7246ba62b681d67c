"""What this node offers hpcmem: NUMA nodes, HBW nodes (and how they were found),
GPUs, the MPI library, memkind, Slurm and a container runtime.

Nothing here is required: a missing piece is reported as such, never an error.
`--json` prints one JSON object with the same content.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from hpcmem import __version__, topology

HELP = "describe this node: NUMA and HBW nodes, GPUs, MPI, memkind, Slurm, containers"

TIMEOUT_S = 10
GIB = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem info``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")


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
    """The NUMA nodes with CPUs and memory in bytes."""
    return [
        {
            "id": node.id,
            "cpus": list(node.cpus),
            "memory_total_bytes": node.memory_total,
            "memory_free_bytes": node.memory_free,
            "memory_only": node.memory_only,
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


def memkind_info() -> dict[str, Any]:
    """The memkind version hpcmem._hbw runs with, or why there is none."""
    from hpcmem import hbw

    try:
        return {"version": hbw.memkind_version()}
    except hbw.MemkindNotBuiltError as error:
        return {"version": None, "error": str(error)}


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
        "library": MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip(),
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


def container_info() -> dict[str, Any]:
    """An Apptainer/Singularity runtime on PATH, and the container this runs in, if any."""
    inside = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    for name in ("apptainer", "singularity"):
        if shutil.which(name):
            ok, out = _command(name, "--version")
            version = out.split()[-1] if ok and out else None
            return {"runtime": name, "version": version, "inside": inside}
    return {"runtime": None, "version": None, "inside": inside}


def collect() -> dict[str, Any]:
    """Everything ``hpcmem info`` reports, as one JSON-ready dict."""
    return {
        "host": socket.gethostname(),
        "hpcmem": __version__,
        "numa_nodes": numa_info(),
        "hbw": hbw_info(),
        "memkind": memkind_info(),
        "gpus": gpu_info(),
        "mpi": mpi_info(),
        "slurm": slurm_info(),
        "container": container_info(),
    }


def _hbw_line(hbw: dict[str, Any]) -> str:
    if "error" in hbw:
        return f"error: {hbw['error']}"
    if not hbw["nodes"]:
        return "none (no HMAT, memory-only or memkind HBW node; MEMKIND_HBW_NODES unset)"
    nodes = topology.format_node_list(hbw["nodes"])
    if hbw["source"] == topology.HBW_NODES_VARIABLE:
        how = "declared by MEMKIND_HBW_NODES" + (", emulated on DRAM" if hbw["emulated"] else "")
    else:
        how = f"detected by {hbw['source']}"
    return f"{nodes} ({how})"


def render(info: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [f"hpcmem {info['hpcmem']} on {info['host']}", "NUMA nodes:"]
    for node in info["numa_nodes"]:
        cpus = node["cpus"] and f"CPUs {topology.format_node_list(node['cpus'])}"
        total, free = node["memory_total_bytes"] / GIB, node["memory_free_bytes"] / GIB
        lines.append(
            f"  node {node['id']}: {cpus or 'no CPUs (memory only)'}, "
            f"{total:.1f} GiB ({free:.1f} GiB free)"
        )
    lines.append(f"HBW nodes: {_hbw_line(info['hbw'])}")
    memkind = info["memkind"]
    lines.append(f"memkind: {memkind['version'] or 'not available: ' + memkind['error']}")
    gpus = info["gpus"]
    lines.append("GPUs: " + ("none" if not gpus else f"{len(gpus)}"))
    for gpu in gpus:
        memory = gpu["memory_total_bytes"]
        size = f"{memory / GIB:.1f} GiB" if memory is not None else "memory unknown"
        lines.append(f"  GPU {gpu['index']}: {gpu['name']}, {size}")
    mpi = info["mpi"]
    if mpi["library"]:
        lines.append(f"MPI: {mpi['library']} (MPI {mpi['standard']}, mpi4py {mpi['mpi4py']})")
    else:
        lines.append(f"MPI: {mpi['error']}")
    slurm = info["slurm"]
    if not slurm["installed"]:
        lines.append("Slurm: not installed (no sinfo on PATH)")
    else:
        version = slurm["version"] or f"installed, not usable ({slurm['error']})"
        job = f"job {slurm['job_id']}" if slurm["job_id"] else "not in a job"
        lines.append(f"Slurm: {version}; {job}")
    box = info["container"]
    if box["runtime"]:
        lines.append(f"Container runtime: {box['runtime']} {box['version'] or '(version unknown)'}")
    else:
        lines.append("Container runtime: none (no apptainer or singularity on PATH)")
    if box["inside"]:
        lines.append(f"  running inside {box['inside']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report (or JSON) and return 0."""
    info = collect()
    print(json.dumps(info) if args.json else render(info))
    return 0
