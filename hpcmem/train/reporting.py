"""The training benchmark's part of the report, registered in :mod:`hpcmem.results.registry`:
its section, the scaling with GPUs (with the runs left out) and the table ``hpcmem aggregate``
writes."""

from __future__ import annotations

from hpcmem.draw.reporting import Reporting
from hpcmem.train import report, scaling, tables
from hpcmem.train.spec import TRAIN

__all__ = ["REPORTING"]

REPORTING = Reporting(
    spec=TRAIN,
    title="Training with Unified Memory",
    section=report.section,
    tables={"train_step_time.csv": tables.step_time_table},
    left_out_section=scaling.section,
)
