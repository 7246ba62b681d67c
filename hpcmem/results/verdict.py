"""What a check concludes, and the verdict on disk and on the terminal.

A figure's verdict (:class:`Row`) is one of :data:`VERDICTS` (docs/verdicts.md). The run's is
``FAIL`` when any figure failed, else ``UNJUDGED`` when no figure was judged (every checked
figure lacked a usable value, or there were none), else ``PASS``.

``hpcmem check --verdict-out`` writes :func:`verdict_document` (through
:func:`hpcmem.results.check.conclude`), ``--table-out`` the table of :func:`format_table`;
``hpcmem report --verdict`` and the workflow read the file back with :func:`read_verdict`,
which checks every field they use (the verdicts, the counts, each figure's fields), so that a
damaged file is refused in one line instead of half rendered. :func:`summary_lines` say the
verdict in a few lines for a terminal; the full table stays in the verdict files.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from hpcmem.errors import HpcmemError, clip
from hpcmem.record.provenance import utc_now
from hpcmem.record.samples import NOISY_SPREAD, finite_number
from hpcmem.textfiles import TextFileError, read_text

__all__ = ["JUDGED", "MAX_LISTED", "RUN_VERDICTS", "VERDICTS", "CheckError", "CheckResult",
           "Row", "VerdictError", "format_table", "headline", "judged_against", "read_verdict",
           "summary_lines", "tally", "verdict_document", "write_document", "write_table"]

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


def judged_against(figures: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many judged figures (:data:`CONCLUSIVE`) each side judged: ``references`` (a
    reference's bounds applied), ``history`` (the history's band applied; a figure judged
    against both counts in both) and ``failed points or records`` (FAIL rows of a failed
    point or an invalid record, judged against neither)."""
    judged = [f for f in figures if f.get("verdict") in CONCLUSIVE]
    references = [f.get("reference") is not None for f in judged]
    history = [f.get("history_lower_bound") is not None
               or f.get("history_upper_bound") is not None for f in judged]
    return {"references": sum(references), "history": sum(history),
            "failed points or records": sum(not (r or h) for r, h in
                                            zip(references, history, strict=True))}


def headline(counts: Mapping[str, int], figures: Iterable[Mapping[str, Any]] = ()) -> str:
    """How much of a run was judged, as the report and the terminal say it first: judged
    (PASS or FAIL) of all figures, against what (from ``figures``, the verdict file's), the
    regressions (FAIL), then the new, noisy, missing and unjudged ones where there are any.
    A run that judged nothing and has new figures is a new baseline.

    >>> headline({"PASS": 6, "FAIL": 0, "NOISY": 0, "NEW": 106, "MISSING": 0, "UNJUDGED": 0})
    '6 of 112 figures judged: 0 regressions, 106 new'
    >>> headline({"PASS": 3, "FAIL": 1, "NOISY": 2},
    ...          [{"verdict": "FAIL", "reference": 1.0}, {"verdict": "PASS", "reference": 2.0},
    ...           {"verdict": "PASS", "history_lower_bound": 0.5}, {"verdict": "PASS"}])
    '4 of 6 figures judged (2 against references, 1 against history, 1 from failed points \
or records): 1 regression, 2 noisy'
    >>> headline({"NEW": 120})
    'new baseline: none of 120 figures judged (nothing to compare with yet), 120 new'
    """
    judged = sum(counts.get(name, 0) for name in CONCLUSIVE)
    total = sum(counts.values())
    rest = [f"{counts[name]} {name.lower()}" for name in ("NEW", "NOISY", "MISSING", "UNJUDGED")
            if counts.get(name)]
    if not judged and counts.get("NEW"):
        return ", ".join([f"new baseline: none of {total} figures judged (nothing to compare "
                          "with yet)", *rest])
    sides = [f"{n} against {side}" if side in ("references", "history") else f"{n} from {side}"
             for side, n in judged_against(figures).items() if n]
    against = f" ({', '.join(sides)})" if sides else ""
    failed = counts.get("FAIL", 0)
    regressions = f"{failed} regression{'' if failed == 1 else 's'}"
    return ", ".join([f"{judged} of {total} figures judged{against}: {regressions}", *rest])


class VerdictError(HpcmemError, ValueError):
    """A file that is not a readable verdict of :func:`hpcmem.results.check.conclude`."""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_table(result: CheckResult) -> str:
    """The verdict table as fixed-width text, with a closing summary line."""
    header = ("FIGURE", "VALUE", "SPREAD", "REFERENCE", "BOUNDS", "HISTORY", "P", "VERDICT",
              "NOTE")
    lines = []
    for r in result.rows:
        value = "-" if r.value is None else f"{r.value:.4g} {r.unit}"
        spread_text = "-" if r.spread is None else f"{r.spread:.0%}"
        bounds = "-" if r.reference is None else f"[{_fmt(r.lower_bound)}, {_fmt(r.upper_bound)}]"
        hist = "-" if r.history_median is None else f"{r.history_median:.4g} (n={r.history_runs})"
        p_value = "-" if r.p_value is None else f"{r.p_value:.2g}"
        lines.append((r.figure, value, spread_text, _fmt(r.reference), bounds, hist, p_value,
                      r.verdict, r.note))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header) - 1)]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        + "  " + row[-1]
        for row in [header, *lines]
    ]
    history = (f"history {result.history_folder} (last {result.history_last} runs"
               f"{', this run appended' if result.appended else ''})"
               if result.history_folder else "no history")
    text.append(f"# {result.verdict}: {tally(result.counts())}; system {result.system}, "
                f"run {result.run_id}, {history}")
    return "\n".join(line.rstrip() for line in text)


def verdict_document(result: CheckResult, references_path: str) -> dict[str, Any]:
    """The verdict file's content, for ``hpcmem report --verdict`` and the summary lines."""
    return {
        "verdict": result.verdict,
        "system": result.system,
        "run_id": result.run_id,
        "checked_at": utc_now(),
        "references": references_path,
        "history": {"folder": result.history_folder, "last": result.history_last,
                    "appended": result.appended},
        "max_spread": result.max_spread,
        "counts": result.counts(),
        "figures": [asdict(row) for row in result.rows],
    }


def _write_text(handle: IO[str], text: str) -> None:
    """``text`` written and flushed to disk, so that a full disk shows here."""
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())


def write_document(handle: IO[str], result: CheckResult, references_path: str) -> None:
    """The verdict file (:func:`verdict_document` as JSON) written to ``handle``, on disk."""
    _write_text(handle, json.dumps(verdict_document(result, references_path), indent=1) + "\n")


def write_table(handle: IO[str], result: CheckResult) -> None:
    """The table of :func:`format_table` written to ``handle``, on disk."""
    _write_text(handle, format_table(result) + "\n")


def read_verdict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The verdict :func:`write_document` wrote; VerdictError names what is wrong with it."""
    try:
        verdict = json.loads(read_text(path))
    except TextFileError as error:
        raise VerdictError(str(error)) from None
    except json.JSONDecodeError as error:
        raise VerdictError(f"{path}:{error.lineno}: not JSON ({error.msg})") from None
    if not isinstance(verdict, dict) or "verdict" not in verdict or "figures" not in verdict:
        raise VerdictError(f"{path}: not an `hpcmem check --verdict-out` file")
    if problem := _problem(verdict):
        raise VerdictError(f"{path}: {problem}")
    return verdict


#: fields of every figure in a verdict file: text, and numbers or null
_TEXT_FIELDS = ("figure", "unit", "note")
_NUMBER_FIELDS = ("value", "reference", "lower_bound", "upper_bound", "history_median")
#: fields added later: a file written before them lacks them
_LATER_NUMBER_FIELDS = ("spread", "p_value", "history_lower_bound", "history_upper_bound")


def _shown(value: Any) -> str:
    return clip(repr(value), 60)


def _figure_problem(figure: Any) -> str | None:
    """What is wrong with one figure of a verdict file, or None."""
    if not isinstance(figure, dict):
        return f"{_shown(figure)} is not a mapping"
    for name in (*_TEXT_FIELDS, *_NUMBER_FIELDS, "verdict"):
        if name not in figure:
            return f"no field {name!r}"
    for name in _TEXT_FIELDS:
        if not isinstance(figure[name], str):
            return f"{name}: {_shown(figure[name])} is not text"
    for name in (*_NUMBER_FIELDS, *_LATER_NUMBER_FIELDS):
        if (value := figure.get(name)) is not None and not finite_number(value):
            return f"{name}: {_shown(value)} is not a number or null"
    if figure["verdict"] not in VERDICTS:
        return f"verdict: {_shown(figure['verdict'])} is not one of {', '.join(VERDICTS)}"
    return None


def _problem(verdict: dict[str, Any]) -> str | None:
    """What is wrong with a loaded verdict file, or None: its verdict, counts and figures
    must be what :func:`verdict_document` writes, the counts those of the figures."""
    if verdict["verdict"] not in RUN_VERDICTS:
        return f"verdict: {_shown(verdict['verdict'])} is not one of {', '.join(RUN_VERDICTS)}"
    figures, counts = verdict["figures"], verdict.get("counts")
    if not isinstance(figures, list):
        return f"figures: {_shown(figures)} is not a list"
    for index, figure in enumerate(figures):
        if problem := _figure_problem(figure):
            return f"figures[{index}]: {problem}"
    if not isinstance(counts, dict) or not all(
            name in VERDICTS and isinstance(n, int) and not isinstance(n, bool) and n >= 0
            for name, n in counts.items()):
        return f"counts: {_shown(counts)} is not a mapping of verdict -> count"
    found = Counter(figure["verdict"] for figure in figures)
    if {name: n for name, n in counts.items() if n} != dict(found):
        listed = tally({name: found[name] for name in VERDICTS if found[name]}) or "none"
        return f"counts: {_shown(counts)} are not those of its figures ({listed})"
    return None


#: figures listed per verdict (FAIL, NOISY; UNJUDGED: half as many) before "... and N more"
MAX_LISTED = 6
_NOTE_WIDTH = 110


def _listed(verdict: str, rows: list[dict[str, Any]], most: int = MAX_LISTED
            ) -> Iterable[str]:
    chosen = [r for r in rows if r.get("verdict") == verdict]
    for row in chosen[:most]:
        note = str(row.get("note") or "")
        if len(note) > _NOTE_WIDTH:
            note = note[:_NOTE_WIDTH - 3] + "..."
        yield f"  {verdict} {row.get('figure')}: {note}"
    if len(chosen) > most:
        yield f"  ... and {len(chosen) - most} more {verdict} (see the full table)"


def summary_lines(verdict: dict[str, Any], *, report: str | None = None,
                  table: str | None = None) -> list[str]:
    """At most about 20 lines: the verdict and how much was judged
    (:func:`headline`), up to :data:`MAX_LISTED` failing and noisy
    figures each and half as many unjudged ones, and where the report and the full verdict
    table are."""
    counts = headline(verdict.get("counts") or {}, verdict.get("figures") or [])
    lines = [f"hpcmem: {verdict.get('verdict')}: {counts} (system {verdict.get('system')}, "
             f"run {verdict.get('run_id')})"]
    rows = verdict.get("figures") or []
    lines.extend(_listed("FAIL", rows))
    lines.extend(_listed("NOISY", rows))
    lines.extend(_listed("UNJUDGED", rows, MAX_LISTED // 2))
    if report:
        lines.append(f"hpcmem: report  {report}")
    if table:
        lines.append(f"hpcmem: verdict {table} (every figure)")
    return lines
