"""What a benchmark registers for the report: its heading, derived tables and sections.

A benchmark declares one :class:`Reporting` next to its producer (beside, not inside, the
spec a measuring rank loads); :mod:`hpcmem.results.registry` collects them, and
``hpcmem aggregate`` and ``hpcmem report`` draw every registered one without importing
any producer themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcmem.record.spec import Benchmark

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Reporting"]


@dataclass(frozen=True)
class Reporting:
    """The report's view of one benchmark: every callable takes that benchmark's summary
    points only (the summary's rows whose ``benchmark`` is ``spec.name``)."""

    spec: Benchmark
    title: str  # the report's section heading
    #: the report's HTML for this benchmark's summary points
    section: Callable[[pd.DataFrame], str]
    #: file name -> table derived from the summary's points, written by ``hpcmem aggregate``
    tables: Mapping[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)
    #: the HTML comparing these points run in an image with the same points run natively
    #: (container points, native points), or None where the benchmark has no such comparison
    native_section: Callable[[pd.DataFrame, pd.DataFrame], str] | None = None
    #: the figures derived across these points (a ratio to another point's), one column per
    #: derived metric of the spec on the points' index: ``hpcmem aggregate`` writes them into
    #: the summary, where the check and the report read them like measured ones
    derive: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    #: the report draws this section only where the summary holds the benchmark's points or
    #: records left out; otherwise always (saying there are none)
    optional: bool = False
    #: the HTML drawn from these points with the benchmark's records left out of them (its
    #: rows of ``skipped.csv``: failed and skipped runs), placed after ``section``; None: none
    left_out_section: Callable[[pd.DataFrame, pd.DataFrame], str] | None = None
