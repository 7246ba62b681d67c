"""The training benchmark's part of the report, registered in :mod:`hpcmem.results.registry`:
its section and the table ``hpcmem aggregate`` writes."""

from __future__ import annotations

from hpcmem.draw.reporting import Reporting
from hpcmem.train import report, tables
from hpcmem.train.spec import TRAIN

__all__ = ["REPORTING"]

REPORTING = Reporting(
    spec=TRAIN,
    title="Training with Unified Memory",
    section=report.section,
    tables={"train_step_time.csv": tables.step_time_table},
)
