"""Where a budgeted step's time goes, drawn beside the budget curve.

For every point run under a GPU budget whose strategy accounted for its step (the host
optimizer does), one group of bars: the measured step beside its parts (compute from the
start of forward to the end of backward, each copy direction's busy time, the CPU
optimizer), the bound those allow when they overlap perfectly, and the design-independent
floor (the working weights in and their gradients out once per step, at the rates measured
in the same run). A step far above its bound loses time to stalls no part accounts for; a
bound far above the floor moves more than any design must.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.draw.plots import PALETTE, grouped_panels
from hpcmem.train.tables import MODEL, STEP, VARIANTS, model_title, variant_label, with_variants
from hpcmem.units import format_size

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PARTS", "time_figure", "time_parts"]

#: the bars of each point, in drawing order: (column, label)
PARTS = (
    (STEP, "step (median)"),
    ("compute_ms", "compute"),
    ("h2d_busy_ms", "H2D busy"),
    ("d2h_busy_ms", "D2H busy"),
    ("cpu_optimizer_ms", "CPU optimizer"),
    ("step_bound_ms", "bound"),
    ("pcie_floor_ms", "PCIe floor"),
)


def time_parts(points: pd.DataFrame) -> pd.DataFrame:
    """The budgeted points that accounted for their step, with the columns of ``PARTS``."""
    columns = [column for column, _ in PARTS]
    if "gpu_budget" not in points or any(c not in points for c in columns):
        return points.iloc[0:0]
    accounted = with_variants(points[points["gpu_budget"].notna()
                                     & points["compute_ms"].notna()])
    order = [*MODEL, "gpu_budget", *VARIANTS]
    return accounted[[*order, *columns]].sort_values(order)


def _draw_parts(axes: Any, group: pd.DataFrame) -> None:
    """One model's panel: per budget, a bar for each of ``PARTS``."""
    import numpy as np

    width = 0.8 / len(PARTS)
    where = np.arange(len(group))
    for index, (column, label) in enumerate(PARTS):
        axes.bar(where + (index - (len(PARTS) - 1) / 2) * width, group[column], width,
                 label=label, color=PALETTE[index % len(PALETTE)])
    axes.set_xticks(where, [format_size(float(b)) + variant_label(d, s, "\n")
                            for b, d, s in zip(group["gpu_budget"],
                                               *(group[v] for v in VARIANTS), strict=True)])
    axes.set_xlabel("GPU budget")
    axes.set_ylabel("ms per step")
    axes.grid(True, axis="y", alpha=0.3)


def time_figure(points: pd.DataFrame) -> str | None:
    """One panel per budgeted model: per budget, the step beside its parts, bound and floor."""
    return grouped_panels(
        time_parts(points), MODEL, _draw_parts, title=model_title, most_columns=2,
        size=(5.6, 4.2), legend="", alt="where a budgeted step's time goes",
        caption="Per budget: the median step beside compute (forward to end of backward), "
                "each copy direction's busy time and the CPU optimizer, all per step; the "
                "bound they allow overlapped perfectly; and the PCIe floor (working weights "
                "in, their gradients out, once per step at the measured rates).")
