"""Scaling curves of the report: latency and bus bandwidth against node count.

One figure per op, dtype, buffer kind, binding and tasks per node that was measured on
more than one node count, one line per message size (at most :data:`MOST_SIZES`, spread
over the sizes measured). Nothing is drawn for a sweep of one node count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from hpcmem.collectives.tables import LATENCY
from hpcmem.draw.plots import PALETTE, count_axis, embed, log_value_axis, new_figure, outside_legend
from hpcmem.units import format_size

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MOST_SIZES", "scaling_figures"]

#: message sizes drawn per figure, spread from the smallest to the largest
MOST_SIZES = 6
_BUS_BANDWIDTH = "busbw_GBps"
_GROUP = ["op", "dtype", "buffer", "binding", "tasks_per_node"]


def _spread(sizes: list[int]) -> list[int]:
    """At most MOST_SIZES of ``sizes`` (sorted), evenly spaced, first and last included."""
    if len(sizes) <= MOST_SIZES:
        return sizes
    step = (len(sizes) - 1) / (MOST_SIZES - 1)
    return [sizes[round(i * step)] for i in range(MOST_SIZES)]


def scaling_figures(points: pd.DataFrame) -> Iterator[str]:
    """Latency and bus bandwidth against node count for each op, one line per size."""
    if "nodes" not in points.columns or points["nodes"].nunique() < 2:
        return
    points = points.assign(tasks_per_node=points["ranks"] // points["nodes"])
    for (op, dtype, buffer, binding, per_node), group in points.groupby(
            _GROUP, sort=True, dropna=False):
        nodes = sorted(int(n) for n in group["nodes"].unique())
        if len(nodes) < 2:
            continue
        figure, (lat, bw) = new_figure(11, 3.9, columns=2)
        sizes = _spread(sorted(int(s) for s in group["size_bytes"].unique()))
        for index, size in enumerate(sizes):
            line = group[group["size_bytes"] == size].sort_values("nodes")
            style = {"color": PALETTE[index % len(PALETTE)], "marker": "o", "markersize": 3.5,
                     "linewidth": 1.6, "label": format_size(size) if size else "no data"}
            lat.plot(line["nodes"], line[LATENCY], **style)
            bw.plot(line["nodes"], line[_BUS_BANDWIDTH], **style)
        for axes in (lat, bw):
            count_axis(axes, nodes, "nodes")
        log_value_axis(lat)
        if group[_BUS_BANDWIDTH].gt(0).any():
            log_value_axis(bw)
        where = f"{buffer}, {binding}, {per_node} ranks per node"
        lat.set_ylabel("average latency (µs)")
        lat.set_title(f"{op} ({dtype}): latency against nodes", fontsize=11)
        bw.set_ylabel("bus bandwidth (GB/s)")
        bw.set_title(f"{op} ({dtype}): bus bandwidth against nodes", fontsize=11)
        outside_legend(figure, [lat], columns=MOST_SIZES, title="message size")
        yield embed(
            figure,
            f"{op} latency and bus bandwidth against node count ({where})",
            f"{op}, {where}: median over repeats of the average latency across ranks (µs) and "
            "bus bandwidth (GB/s, nccl-tests convention) against node count, one line per "
            "message size.",
        )
