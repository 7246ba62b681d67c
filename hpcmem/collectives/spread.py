"""How the ranks of one run spread over nodes, as measured inside the ranks.

Every record says on how many nodes its ranks ran (``nodes``), the most ranks any node
ran (``tasks_per_node``) and the nodes' host names (``hosts``), from the host name each
rank reported, not from what the launcher was asked for; its placement also holds each
node's own NUMA pages (:func:`hpcmem.collectives.placement.placement_by_host`).

>>> layout_fields(["n1", "n1", "n2", "n2"])
{'nodes': 2, 'tasks_per_node': 2, 'hosts': ['n1', 'n2']}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["layout_fields"]


def layout_fields(hosts: Sequence[str]) -> dict[str, Any]:
    """``nodes``, ``tasks_per_node`` (the most ranks on one node) and the sorted ``hosts``
    of ranks that ran on ``hosts`` (rank i on ``hosts[i]``)."""
    counts = Counter(hosts)
    return {"nodes": len(counts), "tasks_per_node": max(counts.values(), default=0),
            "hosts": sorted(counts)}
