"""What this node offers hpcmem: NUMA nodes, HBW and DAX KMEM nodes (and how they were
found), the HBW placement backend (UMF or memkind), GPUs, the MPI library, Slurm and a
container runtime.

Nothing here is required: a missing piece is reported as such, never an error.
`--json` prints one JSON object with the same content.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from hpcmem.node import topology
from hpcmem.node.idlist import format_id_list

HELP = ("describe this node: NUMA, HBW and DAX KMEM nodes, HBW backend, GPUs, MPI, Slurm, "
        "containers")

GIB = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem info``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _hbw_line(hbw: dict[str, Any]) -> str:
    if "error" in hbw:
        return f"error: {hbw['error']}"
    if not hbw["nodes"]:
        return "none (no HMAT or hwloc HBM/MCDRAM node; HPCMEM_HBW_NODES unset)"
    nodes = format_id_list(hbw["nodes"])
    if hbw["source"] in topology.HBW_NODES_VARIABLES:
        how = f"declared by {hbw['source']}" + (", emulated on DRAM" if hbw["emulated"] else "")
    else:
        how = f"detected by {hbw['source']}"
    return f"{nodes} ({how})"


def _dax_kmem_line(dax_kmem: dict[str, Any]) -> str:
    if "error" in dax_kmem:
        return f"error: {dax_kmem['error']}"
    if not dax_kmem["nodes"]:
        return ("none (no kmem DAX device or CPU-less node slower than DRAM in HMAT; "
                "HPCMEM_DAX_KMEM_NODES unset)")
    nodes = format_id_list(dax_kmem["nodes"])
    if dax_kmem["source"] in topology.DAX_KMEM_NODES_VARIABLES:
        return f"{nodes} (declared by {dax_kmem['source']})"
    how = {"kmem": "onlined by the kmem driver",
           "hmat": "detected by hmat: slower than every CPU node's memory, as CXL"}
    return f"{nodes} ({how[dax_kmem['source']]})"


def _hmat(node: dict[str, Any]) -> str:
    """``, HMAT 100 GB/s 100 ns`` for a node with HMAT figures, else nothing."""
    bandwidth, latency = node.get("read_bandwidth_MBps"), node.get("read_latency_ns")
    if bandwidth is None:
        return ""
    return f", HMAT {bandwidth / 1000:g} GB/s" + (f" {latency} ns" if latency else "")


def _backend_line(backend: dict[str, Any]) -> str:
    if not backend["name"]:
        return f"not available: {backend['error']}"
    line = f"{backend['name']} {backend['version']}"
    if backend.get("highest_bandwidth") is not None:  # UMF's own view of the platform
        line += f" (its HIGHEST_BANDWIDTH memspace: {format_id_list(backend['highest_bandwidth'])})"
    return line


def render(info: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [f"hpcmem {info['hpcmem']} on {info['host']}", "NUMA nodes:"]
    for node in info["numa_nodes"]:
        cpus = node["cpus"] and f"CPUs {format_id_list(node['cpus'])}"
        total, free = node["memory_total_bytes"] / GIB, node["memory_free_bytes"] / GIB
        lines.append(
            f"  node {node['id']}: {cpus or 'no CPUs (memory only)'}, "
            f"{total:.1f} GiB ({free:.1f} GiB free){_hmat(node)}"
        )
    lines.append(f"HBW nodes: {_hbw_line(info['hbw'])}")
    lines.append(f"DAX KMEM nodes: {_dax_kmem_line(info['dax_kmem'])}")
    lines.append(f"HBW backend: {_backend_line(info['hbw_backend'])}")
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
    from hpcmem.node.probe import collect

    info = collect()
    print(json.dumps(info) if args.json else render(info))
    return 0
