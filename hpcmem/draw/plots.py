"""matplotlib helpers of the report: figures embedded as PNG, log axes labelled for people."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpcmem.units import format_size

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["DPI", "PALETTE", "count_axis", "embed", "grouped_panels", "log_size_axis",
           "log_value_axis", "new_figure", "outside_legend", "panel_grid", "panels"]

DPI = 100
#: colours of the lines and bars of one figure, in order
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def new_figure(width: float, height: float, columns: int = 1, rows: int = 1
                ) -> tuple[Figure, Any]:
    """A constrained-layout figure and its axes, flattened row by row."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False).ravel()


def panel_grid(count: int, most_columns: int, width: float, height: float
               ) -> tuple[Figure, list[Any]]:
    """A figure of ``count`` panels, ``width`` x ``height`` inches each, at most
    ``most_columns`` to a row; the panels beyond ``count`` are hidden."""
    columns = min(count, most_columns)
    rows = math.ceil(count / columns)
    figure, panels = new_figure(width * columns, height * rows, columns=columns, rows=rows)
    for axes in panels[count:]:
        axes.set_visible(False)
    return figure, list(panels[:count])


def outside_legend(figure: Figure, panels: Sequence[Any], *, columns: int = 5,
                   title: str | None = None) -> None:
    """One legend for the whole figure, below its panels, outside every one's data: each
    label once, in the order first drawn; nothing when no panel has a labelled line."""
    handles: dict[str, Any] = {}
    for axes in panels:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=min(len(handles), columns), fontsize=10, title=title,
                      title_fontsize=10, frameon=False)


def panels(groups: Sequence[tuple[Any, Any]], draw: Callable[[Any, Any], None], *,
           title: Callable[[Any], str], most_columns: int, size: tuple[float, float], alt: str,
           caption: str, heading: str | None = None, legend: str | None = None,
           title_size: int = 10) -> str:
    """One panel per ``(key, group)`` of ``groups``, in their order, ``size`` inches each, at
    most ``most_columns`` to a row: ``draw(axes, group)`` fills it and ``title(key)`` names it
    (``title_size`` points). ``heading``: the figure's title above its panels; ``legend``: the
    title of one legend below the panels (:func:`outside_legend`) instead of one in each. The
    figure embedded (:func:`embed`)."""
    figure, grid = panel_grid(len(groups), most_columns, *size)
    for axes, (key, group) in zip(grid, groups, strict=True):
        draw(axes, group)
        axes.set_title(title(key), fontsize=title_size)
    if heading:
        figure.suptitle(heading, fontsize=12)
    if legend is not None:
        outside_legend(figure, grid, title=legend or None)
    return embed(figure, alt, caption)


def grouped_panels(table: pd.DataFrame, by: str | Sequence[str],
                   draw: Callable[[Any, pd.DataFrame], None], *, title: Callable[[Any], str],
                   most_columns: int, size: tuple[float, float], alt: str, caption: str,
                   heading: str | None = None, legend: str | None = None) -> str | None:
    """:func:`panels` of ``table`` grouped by ``by`` (sorted, a missing value a group of its
    own), or None for an empty table."""
    if table.empty:
        return None
    return panels(list(table.groupby(by, sort=True, dropna=False)), draw, title=title,
                  most_columns=most_columns, size=size, alt=alt, caption=caption,
                  heading=heading, legend=legend)


def embed(figure: Figure, alt: str, caption: str) -> str:
    """The figure as an ``<img>`` with a base64 PNG data URI, inside a ``<figure>``."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    width, height = (round(v * DPI) for v in figure.get_size_inches())
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'alt="{html.escape(alt)}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def log_size_axis(axes: Any, sizes: Any, most: int = 10) -> None:
    """A log2 x axis labelled in bytes, at most about ``most`` ticks over the sizes plotted
    (fewer for a narrow panel, so that the labels never overlap)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = (int(math.log2(v)) for v in (min(sizes), max(sizes)))
    step = max(1, math.ceil((high - low + 1) / most))
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(low, high + 1, step)]))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_formatter(FuncFormatter(lambda size, _pos: format_size(size)))
    axes.set_xlabel("message size (bytes)")
    axes.grid(True, which="major", alpha=0.3)


def count_axis(axes: Any, counts: Sequence[int], label: str) -> None:
    """A log2 x axis with a tick at every count measured (nodes, GPUs), labelled ``label``."""
    from matplotlib.ticker import FixedLocator, NullLocator

    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(counts))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([str(n) for n in counts])
    axes.set_xlabel(label)
    axes.grid(True, which="major", alpha=0.3)


def _plain(value: float, _pos: Any = None) -> str:
    return f"{value:g}"


def log_value_axis(axes: Any) -> None:
    """A log y axis with plain numbers, labelling minor ticks when it spans few decades."""
    from matplotlib.ticker import FuncFormatter

    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(_plain))
    low, high = axes.get_ylim()
    decades = math.log10(high / low)
    labelled = (2, 3, 4, 5, 6, 7, 8, 9) if decades < 1 else (2, 5) if decades < 3.5 else ()
    if labelled:
        def minor(value: float, _pos: Any = None) -> str:
            digit = round(value / 10 ** math.floor(math.log10(value)))
            return f"{value:g}" if digit in labelled else ""

        axes.yaxis.set_minor_formatter(FuncFormatter(minor))
        axes.grid(True, which="minor", axis="y", alpha=0.15)
    axes.grid(True, which="major", axis="y", alpha=0.3)
