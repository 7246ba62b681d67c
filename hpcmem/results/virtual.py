"""Points measured in a virtual machine, kept apart from real ones from summary to report.

A record made in a tools/vm guest names its topology (``vm_topology``,
:mod:`hpcmem.node.virtual`): the NUMA layout and HMAT are real to the guest's kernel, its
bandwidth and latency are not the hardware's. Such a point is a point of its own (its key
ends in ``/vm=<topology>``, so no median mixes it with a real one), its system is
``vm:<topology>`` (no reference or history of a real system applies), the check judges none
of its figures (``UNJUDGED``, saying why, and nothing of it enters the history), the
aggregate's derived tables and the report's benchmark sections leave it out, and the report
lists it in a section of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import section, table
from hpcmem.results.registry import BENCHMARKS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NOTE", "VM_COLUMN", "is_vm_system", "point_key", "point_vm", "split", "vm_name",
           "vm_section", "vm_system"]

#: the summary column naming a point's VM topology ("" for a real node)
VM_COLUMN = "vm_topology"
#: the note of every figure of such a point in the verdict
NOTE = ("measured in a virtual machine ({name}): its bandwidth and latency are not the "
        "hardware's, so it is judged against nothing")
_SYSTEM_NAME = "vm"


def vm_name(record: Mapping[str, Any]) -> str:
    """The VM topology a record was measured in, "" on a real node."""
    topology = record.get("vm_topology")
    return str(topology.get("name") or "") if isinstance(topology, Mapping) else ""


def point_vm(point: Mapping[str, Any]) -> str:
    """The VM topology a summary point was measured in, "" on a real node."""
    value = point.get(VM_COLUMN)
    return value if isinstance(value, str) else ""


def point_key(key: str, vm: str) -> str:
    """A point key made a VM point's own: ``<key>/vm=<topology>`` (``key`` on a real node)."""
    return f"{key}/vm={vm}" if vm else key


def vm_system(vm: str) -> str:
    """The system a VM point is judged for: ``vm:<topology>``, no real system."""
    return f"{_SYSTEM_NAME}:{vm}"


def is_vm_system(system: str) -> bool:
    """Whether ``system`` is a VM point's (:func:`vm_system`)."""
    return system.partition(":")[0] == _SYSTEM_NAME


def split(points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The summary rows measured on real nodes, and those measured in virtual machines."""
    import pandas as pd

    virtual = pd.Series([point_vm(point) != "" for point in points.to_dict("records")],
                        index=points.index, dtype=bool)
    return points[~virtual].reset_index(drop=True), points[virtual].reset_index(drop=True)


def _figures(point: Mapping[str, Any]) -> str:
    """The checked figures of a VM point, as text."""
    parts = []
    for metric in BENCHMARKS[point["benchmark"]].metrics:
        value = point.get(metric.name)
        if metric.checked and metric.applies(point) and isinstance(value, int | float):
            parts.append(f"{metric.name} {value:.4g} {metric.unit}")
    return ", ".join(parts)


def vm_section(points: pd.DataFrame) -> str:
    """The report's section of the points measured in virtual machines (``points``: those
    of :func:`split`, at least one)."""
    rows = [[p[VM_COLUMN], p["point"], p["hosts"], p["repeats"], _figures(p)]
            for p in points.to_dict("records")]
    note = ('<p class="note">These points ran in virtual machines (tools/vm): their NUMA '
            "layout and HMAT attributes are the guest firmware's description, their bandwidth "
            "and latency are not the hardware's. They are shown apart, in no table or plot of "
            "real nodes, and the check judges none of their figures.</p>")
    topologies = ", ".join(sorted(set(points[VM_COLUMN])))
    return section(f"Virtual machines ({topologies})", note,
                   table(["VM topology", "point", "hosts", "repeats",
                          "figures (not the hardware's)"], rows,
                         ["text", "key", "text", "num", "text"]),
                   anchor="virtual")
