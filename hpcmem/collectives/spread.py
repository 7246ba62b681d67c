"""How the ranks of one run spread over nodes, as measured inside the ranks.

Every record says on how many nodes its ranks ran (``nodes``), the most ranks any node
ran (``tasks_per_node``) and the nodes' host names (``hosts``), from the host name each
rank reported, not from what the launcher was asked for; its placement also holds each
node's own NUMA pages (``placement.hosts``), since node 0 of one host is not node 0 of
another.

>>> layout_fields(["n1", "n1", "n2", "n2"])
{'nodes': 2, 'tasks_per_node': 2, 'hosts': ['n1', 'n2']}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["layout_fields", "placement_by_host"]


def layout_fields(hosts: Sequence[str]) -> dict[str, Any]:
    """``nodes``, ``tasks_per_node`` (the most ranks on one node) and the sorted ``hosts``
    of ranks that ran on ``hosts`` (rank i on ``hosts[i]``)."""
    counts = Counter(hosts)
    return {"nodes": len(counts), "tasks_per_node": max(counts.values(), default=0),
            "hosts": sorted(counts)}


def placement_by_host(
    placements: Sequence[Sequence[dict[str, Any] | None]],
    hosts: Sequence[str],
    merge: Callable[[list[dict[str, Any] | None]], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Per host, the pages per NUMA node and the HBW fraction of its ranks' buffers
    (``placements[i]`` are rank i's buffers, merged with ``merge``)."""
    by_host: dict[str, list[dict[str, Any] | None]] = {}
    for host, buffers in zip(hosts, placements, strict=True):
        by_host.setdefault(host, []).extend(buffers)
    merged = {host: merge(buffers) for host, buffers in sorted(by_host.items())}
    return {host: {"nodes": m["nodes"], "hbw_fraction": m["hbw_fraction"]}
            for host, m in merged.items()}
