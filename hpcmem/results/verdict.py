"""What a check concludes: a verdict on every figure (:class:`Row`) and the run's result.

A figure's verdict is one of :data:`VERDICTS` (docs/verdicts.md). The run's is ``FAIL`` when
any figure failed, else ``UNJUDGED`` when no figure was judged (every checked figure lacked a
usable value, or there were none), else ``PASS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcmem.errors import HpcmemError
from hpcmem.record.samples import NOISY_SPREAD

__all__ = ["JUDGED", "RUN_VERDICTS", "VERDICTS", "CheckError", "CheckResult", "Row", "headline",
           "tally"]

#: the verdicts of a figure: a FAIL fails the run, and so does having no judged figure
VERDICTS = ("PASS", "FAIL", "NOISY", "NEW", "MISSING", "UNJUDGED")
#: the verdicts of a figure that was judged: its value was looked at (or its point failed)
JUDGED = ("PASS", "FAIL", "NOISY", "NEW")
#: the verdicts of a run
RUN_VERDICTS = ("PASS", "FAIL", "UNJUDGED")


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
    #: the band around the history's median it was judged against (None: not judged
    #: against the history, or that side open)
    history_lower_bound: float | None = None
    history_upper_bound: float | None = None


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
        """``FAIL`` when any figure failed, else ``UNJUDGED`` when none was judged, else
        ``PASS``."""
        if any(r.verdict == "FAIL" for r in self.rows):
            return "FAIL"
        return "PASS" if any(r.verdict in JUDGED for r in self.rows) else "UNJUDGED"

    def counts(self) -> dict[str, int]:
        """How many rows got each verdict."""
        counts = dict.fromkeys(VERDICTS, 0)
        for row in self.rows:
            counts[row.verdict] += 1
        return counts


def tally(counts: Mapping[str, int]) -> str:
    """Verdict counts as the table, the terminal and the report say them: ``2 pass, 0 fail``."""
    return ", ".join(f"{n} {name.lower()}" for name, n in counts.items())


#: the verdicts a headline counts as judged: compared with a reference or history, and
#: told apart from noise
CONCLUSIVE = ("PASS", "FAIL")


def headline(counts: Mapping[str, int]) -> str:
    """How much of a run was judged, as the report and the terminal say it first: judged
    (PASS or FAIL) of all figures, then, where there are any, the failed, new, noisy,
    missing and unjudged ones.

    >>> headline({"PASS": 6, "FAIL": 0, "NOISY": 0, "NEW": 106, "MISSING": 0, "UNJUDGED": 0})
    '6 of 112 judged, 106 new'
    >>> headline({"PASS": 3, "FAIL": 1, "NOISY": 2, "UNJUDGED": 1})
    '4 of 7 judged (1 failed), 2 noisy, 1 unjudged'
    """
    judged = sum(counts.get(name, 0) for name in CONCLUSIVE)
    failed = f" ({counts['FAIL']} failed)" if counts.get("FAIL") else ""
    rest = [f"{counts[name]} {name.lower()}" for name in ("NEW", "NOISY", "MISSING", "UNJUDGED")
            if counts.get(name)]
    return ", ".join([f"{judged} of {sum(counts.values())} judged{failed}", *rest])

