"""The system (``cluster:partition``) whose references and history apply to a point.

It is chosen per point: ``vm:<topology>`` for a point measured in a virtual machine
(:mod:`hpcmem.results.virtual`: nothing of a real system applies to it), else the one asked
for (``--system``, ``HPCMEM_SYSTEM``), else the Slurm partition the point's records were
measured in, else where the check itself runs.
A run whose points ran in two partitions is judged, and appended to the history, once per
partition.
"""

from __future__ import annotations

import os
import re

from hpcmem.record.provenance import slurm_system
from hpcmem.results.summary import Summary
from hpcmem.results.verdict import CheckError
from hpcmem.results.virtual import point_vm, vm_system

__all__ = ["check_system", "default_system", "point_systems", "requested_system"]

_SYSTEM = re.compile(r"^[^:\s]+:[^:\s]+$")


def check_system(system: str) -> str:
    """``system`` when it reads ``NAME:PARTITION``; CheckError otherwise."""
    if not _SYSTEM.fullmatch(system):
        raise CheckError(f"{system!r} is not NAME:PARTITION (e.g. mycluster:gpu)")
    return system


def requested_system(option: str | None) -> str | None:
    """The system asked for: ``--system`` (``option``), else ``HPCMEM_SYSTEM``, checked by
    :func:`check_system`; None when neither is set (then each point has its own)."""
    system = option or os.environ.get("HPCMEM_SYSTEM")
    return None if system is None else check_system(system)


def default_system() -> str:
    """Where this process runs: Slurm's ``cluster:partition``, else ``<host>:default``."""
    return slurm_system() or f"{os.uname().nodename.split('.')[0]}:default"


def point_systems(summary: Summary, system: str | None = None) -> dict[str, str]:
    """Per point key, the system whose references and history apply: a VM point's own,
    else ``system`` when given, else the one partition its records were measured in, else
    default_system()."""
    here = default_system()
    systems = {}
    for point in summary.points.to_dict("records"):
        recorded = str(point.get("systems") or "")
        if vm := point_vm(point):
            systems[point["point"]] = vm_system(vm)
            continue
        systems[point["point"]] = system or (recorded if recorded and "," not in recorded
                                             else here)
    return systems
