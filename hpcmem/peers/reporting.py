"""The peers' part of the report, registered in :mod:`hpcmem.results.registry`: the figures
derived across their points, their section (drawn when the summary holds peers), the
smallest budget beside each peer's peak (with the runs left out) and the table ``hpcmem
aggregate`` writes."""

from __future__ import annotations

from hpcmem.draw.reporting import Reporting
from hpcmem.peers import floor, section, tables
from hpcmem.peers.spec import PEERS

__all__ = ["REPORTING"]

REPORTING = Reporting(
    spec=PEERS,
    title="Peers: training beyond the GPU against ZeRO-Offload, FSDP2 and others",
    section=section.section,
    tables={"peers_step_time.csv": tables.step_time_table},
    derive=tables.derive,
    optional=True,
    left_out_section=floor.section,
)
