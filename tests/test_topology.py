"""hpcmem.node.topology against this machine's sysfs and numactl, and on small sysfs trees."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hpcmem.node import hwloc, topology
from hpcmem.node.idlist import IdListError


def _numactl_hardware() -> dict[int, tuple[tuple[int, ...], int]]:
    """node -> (cpus, size in MiB) as numactl --hardware reports them."""
    out = subprocess.run(
        ["numactl", "--hardware"], capture_output=True, text=True, check=True
    ).stdout
    cpus = {int(n): tuple(map(int, c.split())) for n, c in re.findall(r"node (\d+) cpus:(.*)", out)}
    sizes = {int(n): int(s) for n, s in re.findall(r"node (\d+) size: (\d+) MB", out)}
    return {n: (cpus[n], sizes[n]) for n in cpus}


def test_numa_nodes_match_numactl() -> None:
    nodes = topology.numa_nodes()
    expected = _numactl_hardware()
    assert [n.id for n in nodes] == sorted(expected)
    for node in nodes:
        cpus, size_mib = expected[node.id]
        assert node.cpus == cpus
        assert abs(node.memory_total / 2**20 - size_mib) <= 1
        assert 0 < node.memory_free <= node.memory_total


def _node_dir(root: Path, node: int, cpus: str, mem_kib: int, bandwidth: int | None = None,
              latency: int | None = None):
    path = root / f"node{node}"
    path.mkdir(parents=True)
    (path / "cpulist").write_text(cpus + "\n")
    (path / "meminfo").write_text(
        f"Node {node} MemTotal:  {mem_kib} kB\nNode {node} MemFree:  {mem_kib // 2} kB\n"
    )
    if bandwidth is not None:
        (path / "access0" / "initiators").mkdir(parents=True)
        (path / "access0" / "initiators" / "read_bandwidth").write_text(f"{bandwidth}\n")
    if latency is not None:
        (path / "access0" / "initiators" / "read_latency").write_text(f"{latency}\n")


def test_numa_nodes_from_sysfs_tree(tmp_path: Path) -> None:
    _node_dir(tmp_path, 0, "0-3", 1024)
    _node_dir(tmp_path, 10, "", 2048)
    _node_dir(tmp_path, 2, "4-5,7", 4096)
    nodes = topology.numa_nodes(tmp_path)
    assert [n.id for n in nodes] == [0, 2, 10]
    assert nodes[1].cpus == (4, 5, 7)
    assert nodes[2].memory_only and not nodes[0].memory_only
    assert (nodes[2].memory_total, nodes[2].memory_free) == (2048 * 1024, 1024 * 1024)


def test_a_sysfs_cpulist_is_bounded_too(tmp_path: Path) -> None:
    _node_dir(tmp_path, 0, "0-999999999", 1024)
    with pytest.raises(IdListError, match=r"cpulist='0-999999999': CPU 65536 does not exist"):
        topology.numa_nodes(tmp_path)


def test_numa_nodes_without_sysfs(tmp_path: Path) -> None:
    (node,) = topology.numa_nodes(tmp_path / "missing")
    assert node.id == 0 and len(node.cpus) == os.cpu_count()
    assert node.memory_total > 0


def test_hbw_detected_by_hmat(tmp_path: Path) -> None:
    _node_dir(tmp_path, 0, "0-3", 1024, bandwidth=200_000)
    _node_dir(tmp_path, 1, "", 1024, bandwidth=800_000)
    _node_dir(tmp_path, 2, "", 1024, bandwidth=50_000)  # CXL: slower than DRAM
    found = topology.hbw_nodes({}, root=tmp_path)
    assert (found.nodes, found.source, found.emulated) == ((1,), "hmat", False)


def test_a_cxl_expander_is_the_dax_kmem_tier_by_hmat(tmp_path: Path) -> None:
    """A CPU-less node slower than every CPU node's DRAM (a CXL expander the firmware
    describes) is the DAX KMEM tier, never HBW; a kmem DAX device or a declaration wins."""
    sysfs, kmem = tmp_path / "sys", tmp_path / "kmem"
    _node_dir(sysfs, 0, "0-1", 1024, bandwidth=100_000, latency=100)
    _node_dir(sysfs, 1, "2-3", 1024, bandwidth=90_000, latency=110)
    _node_dir(sysfs, 2, "", 1024, bandwidth=400_000, latency=130)  # HBM
    _node_dir(sysfs, 3, "", 1024, bandwidth=30_000, latency=250)  # CXL
    _node_dir(sysfs, 4, "", 1024, bandwidth=95_000)  # between the DRAM nodes: neither
    nodes = topology.numa_nodes(sysfs)
    assert [(n.read_bandwidth_MBps, n.read_latency_ns) for n in nodes][3] == (30_000, 250)
    assert topology.hbw_nodes({}, root=sysfs).nodes == (2,)
    assert topology.dax_kmem_nodes({}, root=sysfs, kmem=kmem) == ((3,), "hmat")
    (kmem / "dax0.0").mkdir(parents=True)
    (kmem / "dax0.0" / "target_node").write_text("4\n")
    assert topology.dax_kmem_nodes({}, root=sysfs, kmem=kmem) == ((4,), "kmem")
    declared = topology.dax_kmem_nodes({"HPCMEM_DAX_KMEM_NODES": "1"}, root=sysfs, kmem=kmem)
    assert declared == ((1,), "HPCMEM_DAX_KMEM_NODES")


def test_hbw_declared_on_hbm_node_is_not_emulated(tmp_path: Path) -> None:
    _node_dir(tmp_path, 0, "0-3", 1024, bandwidth=200_000)
    _node_dir(tmp_path, 1, "", 1024, bandwidth=800_000)
    found = topology.hbw_nodes({"MEMKIND_HBW_NODES": "1"}, root=tmp_path)
    assert (found.nodes, found.source, found.emulated) == ((1,), "MEMKIND_HBW_NODES", False)
    found = topology.hbw_nodes({"MEMKIND_HBW_NODES": "0-1"}, root=tmp_path)
    assert (found.nodes, found.emulated) == ((0, 1), True)


def test_hbw_on_this_machine() -> None:
    """This machine has DRAM nodes only: nothing detected, node 0 declared is emulated."""
    if any(n.memory_only or n.read_bandwidth_MBps for n in topology.numa_nodes()):
        pytest.skip("this machine has memory-only or HMAT nodes")
    assert topology.hbw_nodes({}) == topology.HBWNodes((), "none", emulated=False)
    declared = topology.hbw_nodes({"MEMKIND_HBW_NODES": "0"})
    assert declared == topology.HBWNodes((0,), "MEMKIND_HBW_NODES", emulated=True)
    assert bool(declared) and not topology.hbw_nodes({})


@pytest.mark.parametrize(
    ("value", "message"),
    [("99", "node 99 does not exist"), ("0-x", "'0-x' is not a node or a range"),
     ("0-999999999", r"node \d+ does not exist \(nodes here: ")],
)
def test_hbw_declared_bad_value(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^MEMKIND_HBW_NODES='{re.escape(value)}': .*{message}"):
        topology.hbw_nodes({"MEMKIND_HBW_NODES": value})


def test_hpcmem_variable_wins_over_memkind_s(tmp_path: Path) -> None:
    _node_dir(tmp_path, 0, "0-3", 1024, bandwidth=200_000)
    _node_dir(tmp_path, 1, "", 1024, bandwidth=800_000)
    env = {"HPCMEM_HBW_NODES": "1", "MEMKIND_HBW_NODES": "0"}
    found = topology.hbw_nodes(env, root=tmp_path)
    assert (found.nodes, found.source, found.emulated) == ((1,), "HPCMEM_HBW_NODES", False)
    found = topology.hbw_nodes({"MEMKIND_HBW_NODES": "0"}, root=tmp_path)
    assert (found.nodes, found.source, found.emulated) == ((0,), "MEMKIND_HBW_NODES", True)


def test_hwloc_subtypes_name_hbm_and_mcdram() -> None:
    xml = """<topology><object type="Machine" os_index="0">
      <object type="NUMANode" os_index="0" local_memory="1"/>
      <object type="NUMANode" os_index="1" subtype="MCDRAM" local_memory="1"/>
      <object type="NUMANode" os_index="3" subtype="HBM" local_memory="1"/>
      <object type="NUMANode" os_index="4" subtype="CXL-DRAM" local_memory="1"/>
    </object></topology>"""
    assert hwloc.parse_subtypes(xml) == {1: "MCDRAM", 3: "HBM", 4: "CXL-DRAM"}


def test_distances_and_the_nearest_nodes(tmp_path: Path) -> None:
    for node, cpus, distance in ((0, "0", "10 21 13 23"), (1, "1", "21 10 23 13"),
                                 (2, "", "13 23 10 23"), (3, "", "23 13 23 10")):
        _node_dir(tmp_path, node, cpus, 1024)
        (tmp_path / f"node{node}" / "distance").write_text(distance + "\n")
    nodes = topology.numa_nodes(tmp_path)
    assert nodes[1].distances == {0: 21, 1: 10, 2: 23, 3: 13}
    assert topology.nearest(nodes[0], (2, 3)) == (2,)
    assert topology.nearest(nodes[1], (2, 3)) == (3,)
    unknown = topology.NumaNode(0, (0,), 1, 1)
    assert topology.nearest(unknown, (2, 3)) == (2, 3)


def test_dax_kmem_nodes_declared_or_onlined_by_kmem(tmp_path: Path) -> None:
    _node_dir(tmp_path / "sys", 0, "0-1", 1024)
    _node_dir(tmp_path / "sys", 2, "", 1024)
    kmem = tmp_path / "kmem"
    assert topology.dax_kmem_nodes({}, root=tmp_path / "sys", kmem=kmem) == ((), "none")
    (kmem / "dax0.0").mkdir(parents=True)
    (kmem / "dax0.0" / "target_node").write_text("2\n")
    assert topology.dax_kmem_nodes({}, root=tmp_path / "sys", kmem=kmem) == ((2,), "kmem")
    declared = topology.dax_kmem_nodes({"MEMKIND_DAX_KMEM_NODES": "0"}, root=tmp_path / "sys",
                                       kmem=kmem)
    assert declared == ((0,), "MEMKIND_DAX_KMEM_NODES")
