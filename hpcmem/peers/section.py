"""The peers' part of the HTML report.

For each work per step, step time against the GPU memory each variant held (hpcmem's
budgets joined by a line, every peer a point), then the table of
:func:`hpcmem.peers.tables.rows`, what its step figure is and which peer tool was fastest,
and hpcmem's per-step accounting. Where a work per GPU ran on several GPU counts, tokens/s
against GPUs, one line per variant, and its tables add each rank's host memory and the
scaling from one GPU.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import table
from hpcmem.draw.plots import PALETTE, log_value_axis, panels
from hpcmem.peers.tables import GIB, Row, Work, basis_note, loss_shown, rows, shown
from hpcmem.peers.variants import LABELS, VARIANTS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PANELS", "color", "peers_figure", "scaling_figure", "section"]

HEADERS = ("variant", "checkpointing", "budget GiB", "step ms", "each repeat", "tokens/s",
           "allocated GiB", "reserved GiB", "NVML GiB", "held GiB", "vs fastest ZeRO-Offload",
           "vs fastest peer", "vs cuda", "last loss vs cuda (steps)")
KINDS = ("text", "text", *["num"] * (len(HEADERS) - 2))
#: a data-parallel work's columns after those
PARALLEL_HEADERS = ("host GiB (largest rank)", "vs 1 GPU")
#: both figures' panels: two to a row, 5.6 x 4.2 inches, titles in 9 points
PANELS = {"most_columns": 2, "size": (5.6, 4.2), "title_size": 9}


def _number(value: float | None, form: str, scale: float = 1, unit: str = "") -> str | None:
    return shown(value, form, scale, unit, missing=None)


def _cells(row: Row, parallel: bool) -> list[Any]:
    extra = [_number(row.host, ".2f", GIB), _number(row.scaling, ".0%")] if parallel else []
    return [row.label, "yes" if row.checkpointing else "no", _number(row.budget, ".2f", GIB),
            _number(row.step_ms, ".1f"), ", ".join(f"{ms:.1f}" for ms in row.each_ms),
            _number(row.tokens_per_s, ",.0f"),
            *(_number(value, ".2f", GIB)
              for value in (row.allocated, row.reserved, row.nvml, row.held)),
            _number(row.vs_zero, ".2f", unit="x"), _number(row.vs_best, ".2f", unit="x"),
            _number(row.vs_cuda, ".2f", unit="x"),
            loss_shown(row, missing=None), *extra]


def color(variant: str) -> str:
    """hpcmem's colour, or one per peer tool, never hpcmem's."""
    return PALETTE[0 if variant == "hpcmem"
                   else 1 + VARIANTS.index(variant) % (len(PALETTE) - 1)]


def scaling_figure(tables: Mapping[Work, Sequence[Row]]) -> str | None:
    """Tokens/s over all GPUs against the GPU count, one panel per work per GPU measured on
    more than one count, one line per variant and settings."""
    lines: dict[Work, dict[tuple[str, str], list[tuple[int, float]]]] = {}
    for work, measured in tables.items():
        for row in measured:
            if row.tokens_per_s:
                lines.setdefault(replace(work, world_size=1), {}).setdefault(
                    (row.variant, row.label), []).append((work.world_size, row.tokens_per_s))
    drawn = {work: found for work, found in lines.items()
             if len({gpus for points in found.values() for gpus, _ in points}) > 1}
    if not drawn:
        return None

    def draw(axes: Any, found: dict[tuple[str, str], list[tuple[int, float]]]) -> None:
        for (variant, label), points in found.items():
            points.sort()
            axes.plot([gpus for gpus, _ in points], [rate for _, rate in points], "-o",
                      color=color(variant), label=label)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("GPUs (one rank each)")
        axes.set_ylabel("tokens/s over all GPUs")
        axes.legend(fontsize=6)

    return panels(list(drawn.items()), draw, **PANELS,
                  title=lambda work: work.title().replace(" per step", " per GPU per step"),
                  alt="peers: tokens/s against GPUs",
                  caption="Tokens/s over all GPUs (each GPU trains the same batch per step) "
                  "against the number of GPUs, one rank each; each table gives the scaling "
                  "from one GPU (the step on one GPU over the step on N).")


def peers_figure(tables: Mapping[Work, Sequence[Row]]) -> str | None:
    """Step time against GPU memory held, one panel per work with a measured row."""
    from matplotlib.ticker import FuncFormatter

    drawn = {work: [r for r in measured if r.step_ms and r.gpu_bytes]
             for work, measured in tables.items()}
    drawn = {work: measured for work, measured in drawn.items() if measured}
    if not drawn:
        return None

    def draw(axes: Any, measured: list[Row]) -> None:
        ours = sorted((r for r in measured if r.variant == "hpcmem"), key=lambda r: r.gpu_bytes)
        if ours:
            axes.plot([r.gpu_bytes / GIB for r in ours], [r.step_ms for r in ours], "-o",
                      color=PALETTE[0], label="hpcmem under a budget")
            for row in ours:
                asked = row.label.removeprefix(LABELS["hpcmem"]).lstrip(", ")
                budget = _number(row.budget, ".2f", GIB, " GiB")
                axes.annotate(", ".join(filter(None, [budget, asked])),
                              (row.gpu_bytes / GIB, row.step_ms), textcoords="offset points",
                              xytext=(4, 4), fontsize=7)
        for row in measured:
            if row.variant != "hpcmem":  # a colour per tool; a diamond where it recomputed nothing
                axes.plot(row.gpu_bytes / GIB, row.step_ms, "s" if row.checkpointing else "D",
                          markersize=7, color=color(row.variant), label=row.label)
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        axes.set_xlabel("GPU memory held (GiB)")
        axes.set_ylabel("step time (ms)")
        log_value_axis(axes)
        axes.legend(fontsize=6)

    return panels(list(drawn.items()), draw, **PANELS, title=lambda work: work.title(),
                  alt="peers: step time against GPU memory held",
                  caption="Step time (ms; each table's note says whether each run's mean or "
                  "median step) against the GPU memory each variant held: all the process "
                  "held where measured (NVML's per-process figure and hpcmem's managed bytes "
                  "on the GPU), else PyTorch's peak reserved bytes. hpcmem's points are "
                  "labelled with their budget and the options they asked for.")


def section(points: pd.DataFrame) -> str:
    """The figure and one table per work, each variant in its own process
    (benchmarks/gpu/hf_offload.py), or a note when there are no points."""
    if points.empty:
        return '<p class="note">No peers points in this summary.</p>'
    tables = rows(points)
    parts = ['<p class="note">Each variant ran in its own process '
             "(benchmarks/gpu/hf_offload.py); medians over its repeats.</p>",
             peers_figure(tables) or "", scaling_figure(tables) or ""]
    for work, table_rows in tables.items():
        parallel = work.world_size > 1
        headers = (*HEADERS, *PARALLEL_HEADERS) if parallel else HEADERS
        kinds = (*KINDS, "num", "num") if parallel else KINDS
        parts += [f"<h3>{html.escape(work.title())}</h3>",
                  table(headers, [_cells(row, parallel) for row in table_rows], kinds),
                  f'<p class="note">{html.escape(basis_note(table_rows))}</p>']
        parts += [f'<p class="note">{html.escape(f"{row.label}: {row.accounting}")}</p>'
                  for row in table_rows if row.accounting]
    return "\n".join(part for part in parts if part)
