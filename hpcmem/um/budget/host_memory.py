"""Where a budget's page-locked host memory lives, by the node's topology, and where its
pages landed.

The host optimizer's masters, moments and gradients are read and written by the CPU every
step, so the node they live on bounds its step. A host arena's chunks come from one of
:mod:`hpcmem.hbw`'s memory kinds (UMF or memkind on the nodes :mod:`hpcmem.node.topology`
finds: ``hbw`` the HBM nodes nearest the process's CPUs, ``hbw_preferred`` those falling
back to DRAM, ``dram``, ``hbw_interleave``, ``dax_kmem``), or from PyTorch's allocator
(``torch``: pages land where the first thread that writes them runs), and are page-locked
after (``cudaHostRegister`` takes any host memory). Unasked (None), the kind is
``hbw_preferred`` where the node has HBM and a placement backend is built, else ``torch``.

On a GPU the optimizer's threads run on the CPUs of the GPU's own NUMA node
(:func:`gpu_cpus`, the job's mask permitting), so ``hbw`` and first touch both mean the
memory near the GPU. :func:`placement` measures every chunk's pages (``move_pages``) for the
record; :func:`available_host_bytes` says how much more the process may take (a strategy
handing a job to the other asks it first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.um.errors import BudgetError

__all__ = ["HOST_MEMORY", "allocate", "available_host_bytes", "chosen_kind", "gpu_cpus",
           "gpu_numa_node", "placement"]

#: What ``HostOptimizerOffload(host_memory=...)`` accepts: PyTorch's allocator, or a kind.
HOST_MEMORY = ("torch", "dram", "hbw", "hbw_preferred", "hbw_interleave", "dax_kmem")
_PCI = Path("/sys/bus/pci/devices")


def chosen_kind(asked: str | None) -> str:
    """The kind for ``asked`` (module docstring); an asked kind that cannot allocate here
    is refused (:class:`BudgetError`, naming it and why)."""
    if asked == "torch":
        return "torch"
    from hpcmem import hbw
    from hpcmem.node import topology

    try:
        if asked is None:
            hbw.backend()  # built and loadable, or BackendNotBuiltError
            return "hbw_preferred" if topology.hbw_nodes().nodes else "torch"
        hbw.resolve_kind(asked)
    except (hbw.KindUnavailableError, ValueError) as error:
        if asked is None:
            return "torch"
        raise BudgetError(f"offload host_memory: {asked!r} cannot allocate here: {error}"
                          ) from None
    return asked


def allocate(nbytes: int, kind: str) -> Any:
    """``nbytes`` of host memory of ``kind`` as a uint8 tensor (its pages not yet touched
    unless the backend zeroes them)."""
    import torch

    if kind == "torch":
        return torch.empty(nbytes, dtype=torch.uint8)
    import numpy as np

    from hpcmem import hbw

    return torch.from_numpy(hbw.empty(nbytes, np.uint8, kind))


def placement(chunks: list[Any], kind: str) -> dict[str, Any] | None:
    """Where the pages of ``chunks`` (uint8 tensors) are: pages per NUMA node, the HBM
    share, and the kind; None where no placement backend is built."""
    from hpcmem import hbw

    nodes: dict[int, int] = {}
    pages = untouched = 0
    hbw_nodes: tuple[int, ...] = ()
    try:
        for chunk in chunks:
            measured = hbw.placement(chunk.numpy())
            pages, untouched = pages + measured.pages, untouched + measured.untouched
            for node, count in measured.nodes.items():
                nodes[node] = nodes.get(node, 0) + count
            hbw_nodes = measured.hbw_nodes
    except hbw.BackendNotBuiltError:
        return None
    touched = sum(nodes.values())
    on_hbw = sum(n for node, n in nodes.items() if node in hbw_nodes)
    return {"kind": kind, "pages": pages, "untouched": untouched,
            "nodes": {str(node): count for node, count in sorted(nodes.items())},
            "hbw_fraction": on_hbw / touched if hbw_nodes and touched else None}


def gpu_numa_node(device: Any) -> int | None:
    """The NUMA node of CUDA ``device``'s PCI slot (None: unknown, or the machine has one)."""
    import torch

    try:
        props = torch.cuda.get_device_properties(device)
        slot = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        text = (_PCI / slot / "numa_node").read_text().strip()
    except (AttributeError, OSError, RuntimeError):
        return None
    return int(text) if text.lstrip("-").isdigit() and int(text) >= 0 else None


def gpu_cpus(device: Any, allowed: set[int]) -> tuple[set[int], int | None]:
    """The CPUs of ``allowed`` on CUDA ``device``'s NUMA node (all of ``allowed`` where none
    is, or the node is unknown), and that node."""
    from hpcmem.node import topology

    node = gpu_numa_node(device)
    local = next((set(n.cpus) for n in topology.numa_nodes() if n.id == node), set())
    return (local & allowed) or allowed, node


def available_host_bytes(root: Path = Path("/")) -> int | None:
    """Host memory this process can still take: the kernel's ``MemAvailable``, or less
    where its memory cgroup (a Slurm job's, v1 or v2) sets a limit; None where nothing is
    readable. ``root``: where ``proc`` and ``sys`` are."""
    from hpcmem.node.topology import meminfo

    found: list[int] = []
    try:
        if (free := meminfo(root / "proc/meminfo").get("MemAvailable")) is not None:
            found.append(free)
        groups = (root / "proc/self/cgroup").read_text().splitlines()
    except (OSError, ValueError):
        groups = []
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's one hierarchy
            base, files = root / "sys/fs/cgroup" / path.lstrip("/"), ("memory.max",
                                                                      "memory.current")
        elif "memory" in controllers.split(","):
            base = root / "sys/fs/cgroup/memory" / path.lstrip("/")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        try:
            limit, used = ((base / name).read_text().strip() for name in files)
            if limit != "max" and int(limit) < 2**60:  # v1 says "none" with a huge number
                found.append(int(limit) - int(used))
        except (OSError, ValueError):
            continue
    return min(found) if found else None
