"""The verdict on disk and on the terminal: the JSON file, its fixed-width table.

``hpcmem check --verdict-out`` writes :func:`verdict_document` (through
:func:`hpcmem.results.check.conclude`), ``--table-out`` the table of :func:`format_table`;
``hpcmem report --verdict`` and the workflow read the file back with :func:`read_verdict`,
which checks every field they use (the verdicts, the counts, each figure's fields), so that a
damaged file is refused in one line instead of half rendered.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict
from typing import IO, Any

from hpcmem.errors import HpcmemError, clip
from hpcmem.record.provenance import utc_now
from hpcmem.record.samples import finite_number
from hpcmem.results.verdict import RUN_VERDICTS, VERDICTS, CheckResult, tally
from hpcmem.textfiles import TextFileError, read_text

__all__ = ["VerdictError", "format_table", "read_verdict", "verdict_document", "write_document",
           "write_table"]


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
