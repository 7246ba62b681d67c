"""NUMA nodes from sysfs, and which of them are high-bandwidth memory (HBW).

HBW nodes are either declared through ``MEMKIND_HBW_NODES`` (libnuma node-list
syntax, read by memkind at start-up) or detected: by HMAT bandwidth attributes
(``nodeN/access0/initiators/read_bandwidth`` above every CPU node's), by
memory-only NUMA nodes that memkind accepts as HBW (KNL MCDRAM and Xeon Max HBM
in flat mode), or by memkind itself. Declared nodes that are ordinary DRAM nodes
(for example the only node of a one-node machine) are marked ``emulated``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcmem.node.idlist import parse_id_list

__all__ = ["HBWNodes", "NumaNode", "hbw_nodes", "numa_nodes"]

NODE_ROOT = Path("/sys/devices/system/node")
HBW_NODES_VARIABLE = "MEMKIND_HBW_NODES"
#: the CPU ids a sysfs cpulist may name: above any kernel's NR_CPUS (8192 at most today)
_SYSFS_CPUS = range(1 << 16)


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs, memory in bytes, and HMAT read bandwidth if known."""

    id: int
    cpus: tuple[int, ...]
    memory_total: int
    memory_free: int
    read_bandwidth_MBps: int | None = None

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


def _meminfo(path: Path) -> dict[str, int]:
    """``MemTotal``/``MemFree`` in bytes from a (per-node or global) meminfo file."""
    values = {}
    for line in path.read_text().splitlines():
        words = line.replace(":", " ").split()
        # per node: "Node 0 MemTotal: 123 kB"; global: "MemTotal: 123 kB"
        if words and words[0] == "Node":
            words = words[2:]
        if len(words) >= 2 and words[0] in ("MemTotal", "MemFree"):
            values[words[0]] = int(words[1]) * 1024
    return values


def _node(path: Path) -> NumaNode:
    node_id = int(path.name.removeprefix("node"))
    cpulist = (path / "cpulist").read_text().strip()
    cpus = (
        parse_id_list(cpulist, name=f"{path}/cpulist", existing=_SYSFS_CPUS, what="CPU")
        if cpulist
        else ()
    )
    memory = _meminfo(path / "meminfo")
    return NumaNode(
        id=node_id,
        cpus=cpus,
        memory_total=memory.get("MemTotal", 0),
        memory_free=memory.get("MemFree", 0),
        read_bandwidth_MBps=_read_int(path / "access0" / "initiators" / "read_bandwidth"),
    )


def numa_nodes(root: Path = NODE_ROOT) -> list[NumaNode]:
    """The online NUMA nodes, sorted by id.

    Without NUMA support in the kernel (no sysfs node folder) the machine is one
    node 0 holding every online CPU and all memory.
    """
    paths = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name.removeprefix("node")))
    if paths:
        return [_node(path) for path in paths]
    memory = _meminfo(Path("/proc/meminfo"))
    return [
        NumaNode(
            id=0,
            cpus=tuple(range(os.cpu_count() or 1)),
            memory_total=memory.get("MemTotal", 0),
            memory_free=memory.get("MemFree", 0),
        )
    ]


def _hmat_hbw(nodes: list[NumaNode]) -> tuple[int, ...]:
    """Nodes whose HMAT read bandwidth exceeds that of every node with CPUs."""
    dram = [n.read_bandwidth_MBps for n in nodes if n.cpus and n.read_bandwidth_MBps]
    if not dram:
        return ()
    return tuple(n.id for n in nodes if (n.read_bandwidth_MBps or 0) > max(dram))


def _memkind_hbw() -> tuple[int, ...] | None:
    """The node memkind places an HBW page on; () when memkind has no HBW; None without memkind."""
    try:
        from hpcmem import _hbw
    except ImportError:
        return None
    if _hbw.check_available("hbw") != 0:
        return ()
    probe = _hbw.Buffer("hbw", _hbw.page_size(), True)
    return tuple(sorted(k for k in _hbw.page_nodes(probe.address, probe.nbytes) if k >= 0))


def _detect(nodes: list[NumaNode], *, ask_memkind: bool) -> HBWNodes:
    if found := _hmat_hbw(nodes):
        return HBWNodes(found, "hmat", emulated=False)
    memory_only = tuple(n.id for n in nodes if n.memory_only)
    memkind = _memkind_hbw() if ask_memkind else None
    if memory_only and memkind != ():
        return HBWNodes(memory_only, "memory-only", emulated=False)
    if memkind:
        return HBWNodes(memkind, "memkind", emulated=False)
    return HBWNodes((), "none", emulated=False)


def hbw_nodes(environ: Mapping[str, str] | None = None, *, root: Path = NODE_ROOT) -> HBWNodes:
    """The HBW nodes of this machine and how they were found.

    ``MEMKIND_HBW_NODES`` wins when set (``source="MEMKIND_HBW_NODES"``); a node it
    names that does not exist raises :class:`~hpcmem.node.idlist.IdListError`. It is
    ``emulated`` when a declared node is not one that HMAT or the memory-only rule
    detects, i.e. an ordinary DRAM node. Otherwise the source is ``hmat``,
    ``memory-only``, ``memkind`` or ``none`` (no HBW node).
    ``environ`` and ``root`` (the sysfs node folder) default to this machine's.
    """
    env = os.environ if environ is None else environ
    nodes = numa_nodes(root)
    declared = env.get(HBW_NODES_VARIABLE, "").strip()
    if not declared:
        return _detect(nodes, ask_memkind=True)
    parsed = parse_id_list(declared, name=HBW_NODES_VARIABLE, existing=[n.id for n in nodes])
    detected = _detect(nodes, ask_memkind=False).nodes
    return HBWNodes(parsed, HBW_NODES_VARIABLE, emulated=not set(parsed) <= set(detected))
