"""The verdict in a few lines for a terminal: counts, the failing, noisy and unjudged
figures, where the report and the full table are. The full table stays in the verdict
files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcmem.results.verdict import headline

__all__ = ["MAX_LISTED", "summary_lines"]

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
    (:func:`~hpcmem.results.verdict.headline`), up to :data:`MAX_LISTED` failing and noisy
    figures each and half as many unjudged ones, and where the report and the full verdict
    table are."""
    counts = headline(verdict.get("counts") or {})
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
