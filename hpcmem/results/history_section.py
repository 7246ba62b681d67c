"""The report's history section: each judged figure over its last runs, as asv's and
conbench's timelines show a benchmark, from the history store.

A judged figure (``PASS``, ``FAIL`` or ``NOISY`` in this run's verdict) is drawn over the
runs its history store keeps for its system (the last ``history.last`` of them, this run
included once appended): its value per run, the band this run was judged against
(shaded), the runs where it failed (red cross) or was noisy (orange ring). At most
:data:`MOST_DRAWN` are drawn, failures and noisy ones first; the table below lists every
judged figure's runs and values.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from hpcmem.draw.html import table
from hpcmem.draw.plots import PALETTE, embed, panel_grid
from hpcmem.results.history import MAX_LAST, History, PastFigure
from hpcmem.results.verdict import VerdictError

__all__ = ["MOST_DRAWN", "TIMELINE_VERDICTS", "history_section", "judged_rows",
           "verdict_timelines"]

#: the most figures drawn as timelines (failures and noisy ones first): a glance's worth
MOST_DRAWN = 12
#: panels to a row, and each one's size (inches): 10 pt text stays 10 px and more at the
#: report's width
COLUMNS = 3
PANEL = (3.6, 2.9)
#: run numbers on a panel's x axis at most
MOST_TICKS = 10
#: the verdicts of a figure drawn over its history, in the order drawn
TIMELINE_VERDICTS = ("FAIL", "NOISY", "PASS")
_MARKS = {"FAIL": ("x", "#c44e52"), "NOISY": ("o", "#dd8452")}


def judged_rows(verdict: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdict's judged figures, failed and noisy ones first."""
    rows = [r for r in verdict.get("figures", []) if r["verdict"] in TIMELINE_VERDICTS]
    return sorted(rows, key=lambda r: TIMELINE_VERDICTS.index(r["verdict"]))


def verdict_timelines(verdict: Mapping[str, Any]) -> dict[str, list[PastFigure]] | None:
    """The timelines of the verdict's judged figures, from the history store its check used;
    None when it used none. VerdictError when its ``history`` is not what a check writes."""
    history = verdict.get("history")
    if history is None or (isinstance(history, dict) and history.get("folder") is None):
        return None
    folder, last = (history.get("folder"), history.get("last")) \
        if isinstance(history, dict) else (None, None)
    if not isinstance(folder, str) or isinstance(last, bool) or not isinstance(last, int) \
            or not 1 <= last <= MAX_LAST:
        raise VerdictError(f"history: {history!r} is not a folder and a number of runs from "
                           f"1 to {MAX_LAST}")
    names: dict[str, list[str]] = {}
    for row in judged_rows(verdict):
        names.setdefault(row.get("system") or str(verdict.get("system")), []).append(
            row["figure"])
    store, found = History(folder), {}
    for system, figures in names.items():
        found.update(store.timelines(system, figures, last))
    return found


def _runs_with(past: Sequence[PastFigure], verdict: str) -> str:
    return ", ".join(p.run_id for p in past if p.figure.verdict == verdict) or "-"


def _band(row: Mapping[str, Any]) -> tuple[float | None, float | None] | None:
    """The band this run judged the figure in: the history's, else the reference's; None
    when it had neither."""
    for low, high in (("history_lower_bound", "history_upper_bound"),
                      ("lower_bound", "upper_bound")):
        if row.get(low) is not None or row.get(high) is not None:
            return row.get(low), row.get(high)
    return None


def _band_text(band: tuple[float | None, float | None] | None) -> str:
    if band is None:
        return "-"
    return "[" + ", ".join("open" if b is None else f"{b:.4g}" for b in band) + "]"


def _title(figure: str, width: int = 32) -> str:
    """A figure's name without its benchmark, broken after a slash into lines of at most
    ``width`` characters (a longer part stays whole on its own line)."""
    lines = [""]
    for part in figure.split("/")[1:]:
        joined = f"{lines[-1]}/{part}" if lines[-1] else part
        if len(joined) > width and lines[-1]:
            lines[-1] += "/"
            lines.append(part)
        else:
            lines[-1] = joined
    return "\n".join(lines)


def _runs(timelines: Sequence[Sequence[PastFigure]]) -> list[str]:
    """Every run of the drawn timelines, oldest first."""
    found: dict[str, str] = {}
    for past in timelines:
        for point in past:
            found.setdefault(point.run_id, point.timestamp or "")
    return sorted(found, key=lambda run: found[run])


def _value_limits(values: Sequence[float]) -> tuple[float, float]:
    """A y range that shows how the values move: around them, not around their band."""
    low, high = min(values), max(values)
    pad = max((high - low) * 0.3, abs(high) * 0.05, 1e-12)
    return low - pad, high + pad


def _draw(rows: Sequence[dict[str, Any]], timelines: Mapping[str, Sequence[PastFigure]]
          ) -> str:
    from matplotlib.ticker import MaxNLocator

    runs = _runs([timelines[row["figure"]] for row in rows])
    number = {run: index + 1 for index, run in enumerate(runs)}
    figure, panels = panel_grid(len(rows), COLUMNS, *PANEL)
    for axes, row in zip(panels, rows, strict=True):
        past = timelines[row["figure"]]
        xs, values = [number[p.run_id] for p in past], [p.figure.value for p in past]
        bottom, top = _value_limits(values)
        axes.set_ylim(bottom, top)  # fixed: the band may reach far beyond the values
        if (band := _band(row)) is not None:
            low, high = band
            axes.axhspan(bottom if low is None else max(bottom, low),
                         top if high is None else min(top, high),
                         color=PALETTE[2], alpha=0.15, lw=0)
            for edge in (b for b in band if b is not None):
                axes.axhline(edge, color=PALETTE[2], lw=1, ls="--")
        axes.plot(xs, values, "-o", color=PALETTE[0], ms=4, lw=1.4)
        for x, point in zip(xs, past, strict=True):
            if (mark := _MARKS.get(point.figure.verdict or "")) is not None:
                shape, colour = mark
                axes.plot([x], [point.figure.value], shape, ms=10, mfc="none", mec=colour,
                          mew=1.8)
        axes.set_title(_title(row["figure"]), fontsize=10)
        axes.set_xlim(0.5, len(runs) + 0.5)
        if len(runs) <= MOST_TICKS:
            axes.set_xticks(range(1, len(runs) + 1))
        else:  # a long history: a few whole run numbers, never crowded
            axes.xaxis.set_major_locator(MaxNLocator(MOST_TICKS, integer=True))
        axes.tick_params(labelsize=10)
        axes.ticklabel_format(axis="y", useOffset=False)
        axes.set_ylabel(row["unit"], fontsize=10)
        axes.grid(True, axis="y", alpha=0.3)
    figure.supxlabel("run number, oldest first", fontsize=10)
    listed = ", ".join(f"{index} = {run}" for index, run in enumerate(runs, 1))
    return embed(figure, "judged figures over their last runs",
                 "Each judged figure over its last runs, oldest left, on an axis around its "
                 "values: the band this run was judged against shaded between dashed lines "
                 "(where it reaches the values), runs where it failed crossed in red, noisy "
                 f"ones ringed in orange. Runs: {listed}.")


def history_section(verdict: Mapping[str, Any],
                    timelines: Mapping[str, Sequence[PastFigure]]) -> str:
    """The section's HTML: timelines of the judged figures that have a history, and the
    table of every one; a note when none has."""
    rows = [r for r in judged_rows(verdict) if timelines.get(r["figure"])]
    folder = (verdict.get("history") or {}).get("folder")
    if not rows:
        return ('<p class="note">No judged figure has runs in the history store '
                f'<code>{html.escape(str(folder))}</code>.</p>')
    drawn = rows[:MOST_DRAWN]
    more = (f'<p class="note">{len(rows) - len(drawn)} more judged figures are listed below, '
            "not drawn.</p>") if len(rows) > len(drawn) else ""
    listed = table(
        ["figure", "verdict", "band", "runs", "values, oldest first", "failed in", "noisy in"],
        [[r["figure"], r["verdict"], _band_text(_band(r)), len(timelines[r["figure"]]),
          " ".join(f"{p.figure.value:.4g}" for p in timelines[r["figure"]]),
          _runs_with(timelines[r["figure"]], "FAIL"), _runs_with(timelines[r["figure"]], "NOISY")]
         for r in rows],
        ["key", "text", "text", "num", "text", "text", "text"])
    return "\n".join([_draw(drawn, timelines), more,
                      f"<p>History store <code>{html.escape(str(folder))}</code>.</p>", listed])
