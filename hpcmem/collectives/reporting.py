"""The collectives benchmark's part of the report, registered in :mod:`hpcmem.results.registry`:
its section, the tables ``hpcmem aggregate`` writes, and its native-against-container view."""

from __future__ import annotations

from hpcmem.collectives import report, tables
from hpcmem.collectives.container_report import overhead_section
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.draw.reporting import Reporting

__all__ = ["REPORTING"]

REPORTING = Reporting(
    spec=COLLECTIVES,
    title="Collectives",
    section=report.section,
    tables={"collectives_latency.csv": tables.latency_table,
            "collectives_speedup.csv": tables.speedup_table},
    native_section=overhead_section,
)
