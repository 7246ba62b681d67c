"""NUMA nodes from sysfs, and which of them are high-bandwidth memory (HBW) or DAX KMEM.

HBW nodes are either declared, by ``HPCMEM_HBW_NODES`` or (memkind's spelling, which the
workflow's emulation sets) ``MEMKIND_HBW_NODES`` in libnuma node-list syntax, or detected
from the platform: by HMAT bandwidth attributes (``nodeN/access0/initiators/read_bandwidth``
above every CPU node's), else by hwloc's ``MCDRAM``/``HBM`` node subtypes. Declared nodes
that are not detected ones (for example the only node of a one-node machine) are marked
``emulated``. DAX KMEM nodes (the slow tier: CXL or persistent memory as system RAM) are
declared by ``HPCMEM_DAX_KMEM_NODES`` or ``MEMKIND_DAX_KMEM_NODES``, or are the target nodes
of the DAX devices bound to the kernel's ``kmem`` driver, else the CPU-less nodes whose HMAT
read bandwidth is below every CPU node's (a CXL memory expander the firmware describes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcmem.node import hwloc
from hpcmem.node.idlist import parse_id_list

__all__ = ["HBWNodes", "NumaNode", "dax_kmem_nodes", "hbw_nodes", "meminfo", "nearest",
           "numa_nodes"]

NODE_ROOT = Path("/sys/devices/system/node")
DAX_KMEM_ROOT = Path("/sys/bus/dax/drivers/kmem")
#: the variables that declare HBW nodes, the first one set wins
HBW_NODES_VARIABLES = ("HPCMEM_HBW_NODES", "MEMKIND_HBW_NODES")
DAX_KMEM_NODES_VARIABLES = ("HPCMEM_DAX_KMEM_NODES", "MEMKIND_DAX_KMEM_NODES")
#: the CPU ids a sysfs cpulist may name: above any kernel's NR_CPUS (8192 at most today)
_SYSFS_CPUS = range(1 << 16)


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs, memory in bytes, HMAT read bandwidth and latency from its
    nearest initiator if known, and its distance (SLIT) to every node by id."""

    id: int
    cpus: tuple[int, ...]
    memory_total: int
    memory_free: int
    read_bandwidth_MBps: int | None = None
    distances: Mapping[int, int] = field(default_factory=dict, compare=False)
    read_latency_ns: int | None = None

    @property
    def memory_only(self) -> bool:
        """A node with memory and no CPUs (MCDRAM, HBM in flat mode, CXL, DAX kmem)."""
        return not self.cpus and self.memory_total > 0


@dataclass(frozen=True)
class HBWNodes:
    """The HBW nodes, how they were found, and whether they are emulated on DRAM."""

    nodes: tuple[int, ...]
    source: str
    emulated: bool

    def __bool__(self) -> bool:
        return bool(self.nodes)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def meminfo(path: Path) -> dict[str, int]:
    """``MemTotal``, ``MemFree`` and (global only) ``MemAvailable`` in bytes from a
    (per-node or global) meminfo file."""
    values = {}
    for line in path.read_text().splitlines():
        words = line.replace(":", " ").split()
        # per node: "Node 0 MemTotal: 123 kB"; global: "MemTotal: 123 kB"
        if words and words[0] == "Node":
            words = words[2:]
        if len(words) >= 2 and words[0] in ("MemTotal", "MemFree", "MemAvailable"):
            values[words[0]] = int(words[1]) * 1024
    return values


def _distances(path: Path, ids: Sequence[int]) -> dict[int, int]:
    """``nodeN/distance``: one number per online node, in id order ({} when unreadable)."""
    try:
        values = [int(word) for word in (path / "distance").read_text().split()]
    except (OSError, ValueError):
        return {}
    return dict(zip(ids, values, strict=False)) if len(values) == len(ids) else {}


def _node(path: Path, ids: Sequence[int]) -> NumaNode:
    node_id = int(path.name.removeprefix("node"))
    cpulist = (path / "cpulist").read_text().strip()
    cpus = (
        parse_id_list(cpulist, name=f"{path}/cpulist", existing=_SYSFS_CPUS, what="CPU")
        if cpulist
        else ()
    )
    memory = meminfo(path / "meminfo")
    return NumaNode(
        id=node_id,
        cpus=cpus,
        memory_total=memory.get("MemTotal", 0),
        memory_free=memory.get("MemFree", 0),
        read_bandwidth_MBps=_read_int(path / "access0" / "initiators" / "read_bandwidth"),
        distances=_distances(path, ids),
        read_latency_ns=_read_int(path / "access0" / "initiators" / "read_latency"),
    )


def numa_nodes(root: Path = NODE_ROOT) -> list[NumaNode]:
    """The online NUMA nodes, sorted by id.

    Without NUMA support in the kernel (no sysfs node folder) the machine is one
    node 0 holding every online CPU and all memory.
    """
    paths = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name.removeprefix("node")))
    if paths:
        ids = [int(p.name.removeprefix("node")) for p in paths]
        return [_node(path, ids) for path in paths]
    memory = meminfo(Path("/proc/meminfo"))
    return [
        NumaNode(
            id=0,
            cpus=tuple(range(os.cpu_count() or 1)),
            memory_total=memory.get("MemTotal", 0),
            memory_free=memory.get("MemFree", 0),
        )
    ]


def _cpu_bandwidths(nodes: list[NumaNode]) -> list[int]:
    """The HMAT read bandwidths of the nodes with CPUs (their DRAM), where known."""
    return [n.read_bandwidth_MBps for n in nodes if n.cpus and n.read_bandwidth_MBps]


def _hmat_hbw(nodes: list[NumaNode]) -> tuple[int, ...]:
    """Nodes whose HMAT read bandwidth exceeds that of every node with CPUs."""
    dram = _cpu_bandwidths(nodes)
    if not dram:
        return ()
    return tuple(n.id for n in nodes if (n.read_bandwidth_MBps or 0) > max(dram))


def _hmat_slow(nodes: list[NumaNode]) -> tuple[int, ...]:
    """CPU-less nodes whose HMAT read bandwidth is below that of every node with CPUs."""
    dram = _cpu_bandwidths(nodes)
    if not dram:
        return ()
    return tuple(n.id for n in nodes
                 if n.memory_only and 0 < (n.read_bandwidth_MBps or 0) < min(dram))


def _detect(nodes: list[NumaNode], root: Path) -> HBWNodes:
    if found := _hmat_hbw(nodes):
        return HBWNodes(found, "hmat", emulated=False)
    # hwloc reads this machine, not a sysfs tree elsewhere
    if root == NODE_ROOT and (found := hwloc.hbw_nodes()):
        return HBWNodes(found, "hwloc", emulated=False)
    return HBWNodes((), "none", emulated=False)


def _declared(env: Mapping[str, str], variables: Sequence[str]) -> tuple[str, str] | None:
    """The first of ``variables`` set to something, and its value."""
    for variable in variables:
        if value := env.get(variable, "").strip():
            return variable, value
    return None


def hbw_nodes(environ: Mapping[str, str] | None = None, *, root: Path = NODE_ROOT) -> HBWNodes:
    """The HBW nodes of this machine and how they were found.

    ``HPCMEM_HBW_NODES``, else ``MEMKIND_HBW_NODES``, wins when set (``source`` is the
    variable); a node it names that does not exist raises
    :class:`~hpcmem.node.idlist.IdListError`. It is ``emulated`` when a declared node is not
    one the platform describes as HBW, i.e. an ordinary DRAM node. Otherwise the source is
    ``hmat``, ``hwloc`` or ``none`` (no HBW node).
    ``environ`` and ``root`` (the sysfs node folder) default to this machine's.
    """
    env = os.environ if environ is None else environ
    nodes = numa_nodes(root)
    declared = _declared(env, HBW_NODES_VARIABLES)
    if declared is None:
        return _detect(nodes, root)
    variable, value = declared
    parsed = parse_id_list(value, name=variable, existing=[n.id for n in nodes])
    detected = _detect(nodes, root).nodes
    return HBWNodes(parsed, variable, emulated=not set(parsed) <= set(detected))


def dax_kmem_nodes(environ: Mapping[str, str] | None = None, *, root: Path = NODE_ROOT,
                   kmem: Path = DAX_KMEM_ROOT) -> tuple[tuple[int, ...], str]:
    """The DAX KMEM nodes and their source: a variable of ``DAX_KMEM_NODES_VARIABLES``,
    ``kmem`` (the target nodes of the DAX devices the kmem driver onlined), ``hmat`` (CPU-less
    nodes slower than every CPU node's memory) or ``none``."""
    env = os.environ if environ is None else environ
    nodes = numa_nodes(root)
    if declared := _declared(env, DAX_KMEM_NODES_VARIABLES):
        variable, value = declared
        return parse_id_list(value, name=variable, existing=[n.id for n in nodes]), variable
    targets = sorted({target for device in kmem.glob("dax*")
                      if (target := _read_int(device / "target_node")) is not None})
    if targets:
        return tuple(targets), "kmem"
    return (slow, "hmat") if (slow := _hmat_slow(nodes)) else ((), "none")


def nearest(origin: NumaNode, candidates: Sequence[int]) -> tuple[int, ...]:
    """The ``candidates`` at the smallest distance from ``origin`` (all of them when the
    distances are unknown)."""
    known = [n for n in candidates if n in origin.distances]
    if len(known) < len(candidates) or not known:
        return tuple(candidates)
    closest = min(origin.distances[n] for n in known)
    return tuple(n for n in known if origin.distances[n] == closest)
