"""Where a point's buffers are: each buffer's measured pages, merged over ranks and hosts.

Every rank measures its send and receive buffers (:func:`hpcmem.hbw.placement`); rank 0
merges them into one placement for the record, with each host's own NUMA pages
(``placement.hosts``), since node 0 of one host is not node 0 of another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["describe", "gather_placements", "merge_placements", "placement_by_host",
           "point_placement"]

#: per rank, the placements of its send and receive buffers (None: no buffer, not measured)
RankPlacements = Sequence[Sequence[dict[str, Any] | None]]


def _buffer_placement(array: np.ndarray | None) -> dict[str, Any] | None:
    """The measured placement of one buffer; None without one or without hpcmem._hbw built."""
    if array is None or array.size == 0:
        return None
    from hpcmem import hbw

    try:
        return hbw.placement(array).to_record()
    except hbw.BackendNotBuiltError:
        return None


def gather_placements(comm: Any, send: np.ndarray | None, recv: np.ndarray | None
                      ) -> list[list[dict[str, Any] | None]] | None:
    """Every rank's buffers measured; on rank 0 the placements of rank i at index i."""
    return comm.gather([_buffer_placement(send), _buffer_placement(recv)], root=0)


def merge_placements(placements: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One placement for all buffers of all ranks.

    Pages per node and per memory policy (``bind:0``, ``default``…) are summed, the HBW
    fraction is weighted by touched pages;
    ``emulated`` holds when any rank's HBW nodes were declared, not detected.
    """
    measured = [p for p in placements if p is not None]
    nodes: dict[str, int] = {}
    policies: dict[str, int] = {}
    hbw_pages = 0.0
    for placement in measured:
        for node, count in placement["nodes"].items():
            nodes[node] = nodes.get(node, 0) + count
        for policy, count in placement.get("policies", {}).items():
            policies[policy] = policies.get(policy, 0) + count
        if placement["hbw_fraction"] is not None:
            hbw_pages += placement["hbw_fraction"] * sum(placement["nodes"].values())
    touched = sum(nodes.values())
    known = any(p["hbw_fraction"] is not None for p in measured)
    return {
        "hbw_fraction": hbw_pages / touched if known and touched else None,
        "nodes": dict(sorted(nodes.items(), key=lambda item: int(item[0]))),
        "emulated": any(p["emulated"] for p in measured),
        "hbw_nodes": sorted({node for p in measured for node in p.get("hbw_nodes", [])}),
        "hbw_sources": sorted({p["source"] for p in measured if p.get("source")}),
        "pages": sum(p.get("pages", 0) for p in measured),
        "untouched": sum(p.get("untouched", 0) for p in measured),
        "policies": dict(sorted(policies.items())),
        "memkind_kinds": sorted({p["kind"] for p in measured if p.get("kind")}),
        "buffers": len(measured),
    }


def placement_by_host(placements: RankPlacements, hosts: Sequence[str]
                      ) -> dict[str, dict[str, Any]]:
    """Per host, the pages per NUMA node and the HBW fraction of its ranks' buffers
    (``placements[i]`` are rank i's buffers, rank i ran on ``hosts[i]``)."""
    by_host: dict[str, list[dict[str, Any] | None]] = {}
    for host, buffers in zip(hosts, placements, strict=True):
        by_host.setdefault(host, []).extend(buffers)
    merged = {host: merge_placements(buffers) for host, buffers in sorted(by_host.items())}
    return {host: {"nodes": m["nodes"], "hbw_fraction": m["hbw_fraction"]}
            for host, m in merged.items()}


def point_placement(placements: RankPlacements, hosts: Sequence[str]) -> dict[str, Any]:
    """A record's ``placement``: all ranks' buffers merged, and each host's own pages."""
    placement = merge_placements([p for pair in placements for p in pair])
    placement["hosts"] = placement_by_host(placements, hosts)
    return placement


def describe(kind: str, placement: dict[str, Any], memory: dict[str, Any]) -> str:
    """The ``# hpcmem buffer:`` note: kind, memory tier and NUMA nodes actually used."""
    if not placement["buffers"]:
        return f"{kind} (no buffers: the op moves no data)"
    fraction = placement["hbw_fraction"]
    if fraction and fraction >= 1.0:
        tier = "emulated HBW" if placement["emulated"] else "HBW"
    elif fraction:
        tier = f"{fraction:.0%} HBW"
    else:
        tier = "DRAM"
    nodes = list(placement["nodes"])
    where = f"node{'s' if len(nodes) != 1 else ''} {','.join(nodes) or '-'}"
    extra = ""
    if kind == "numpy":
        extra = f", NumPy huge-page advice {'on' if memory['numpy_madvise_hugepage'] else 'off'}"
    return f"{kind} ({tier}, {where}{extra})"
