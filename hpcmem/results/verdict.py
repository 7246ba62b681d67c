"""What a check concludes: a verdict on every figure (:class:`Row`) and the run's result.

A figure's verdict is one of :data:`VERDICTS`; only ``FAIL`` fails the run
(docs/verdicts.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcmem.errors import HpcmemError
from hpcmem.record.samples import NOISY_SPREAD

__all__ = ["VERDICTS", "CheckError", "CheckResult", "Row"]

#: the verdicts of a figure; only FAIL fails the run
VERDICTS = ("PASS", "FAIL", "NOISY", "NEW", "MISSING")


class CheckError(HpcmemError, ValueError):
    """A check setting that is not accepted; the message names the value."""


@dataclass
class Row:
    """The verdict on one figure."""

    figure: str
    value: float | None
    unit: str
    reference: float | None
    lower_bound: float | None
    upper_bound: float | None
    history_median: float | None
    history_runs: int
    verdict: str
    note: str
    #: the system whose references and history the figure was judged against
    system: str = ""
    #: every repeat's value, their (max - min) / median, and the rank test's p-value
    samples: list[float] = field(default_factory=list)
    spread: float | None = None
    p_value: float | None = None
    #: whether the point shared cores with other work (None: not measured)
    shared_cores: bool | None = None


@dataclass
class CheckResult:
    """All verdicts of one check, with the context they were made in."""

    rows: list[Row]
    system: str
    run_id: str
    history_folder: str | None
    history_last: int
    appended: bool
    #: the spread above which a point's repeats counted as too noisy to judge
    max_spread: float = NOISY_SPREAD

    @property
    def verdict(self) -> str:
        """``FAIL`` when any figure failed, else ``PASS``."""
        return "FAIL" if any(r.verdict == "FAIL" for r in self.rows) else "PASS"

    def counts(self) -> dict[str, int]:
        """How many rows got each verdict."""
        counts = dict.fromkeys(VERDICTS, 0)
        for row in self.rows:
            counts[row.verdict] += 1
        return counts
