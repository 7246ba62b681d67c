"""The budget curve of the training report: step time against the GPU memory each variant
held, one panel per model that ran under a GPU budget.

A budgeted ``hpcmem`` run is plotted at its peak GPU-resident bytes (``peak_gpu_resident_bytes``)
and joined to the other budgets of its model by a line; every other variant (``cuda``, FSDP2
CPU offload with or without activation offload) is one point at PyTorch's peak reserved bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.draw.plots import PALETTE, grouped_panels, log_value_axis
from hpcmem.train.tables import MODEL, STEP, VARIANTS, model_title, variant_label, with_variants

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MEMORY", "budget_figure", "budget_points"]

#: the column of the GPU memory a point held
MEMORY = "gpu_bytes"
GiB = 2**30


def budget_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points of models with at least one budgeted run, with the memory each held."""
    import pandas as pd

    if "gpu_budget" not in points or points["gpu_budget"].isna().all():
        return points.iloc[0:0].assign(**{MEMORY: pd.Series(dtype=float)})
    budgeted = points.loc[points["gpu_budget"].notna(), MODEL].drop_duplicates()
    table = points.merge(budgeted, on=MODEL, how="inner")
    resident = table.get("peak_gpu_resident_bytes", pd.Series(float("nan"), index=table.index))
    reserved = table.get("peak_reserved_bytes", pd.Series(float("nan"), index=table.index))
    held = resident.where(table["gpu_budget"].notna(), reserved).astype(float)
    drawn = with_variants(table).assign(**{MEMORY: held}).dropna(subset=[MEMORY, STEP])
    return drawn[drawn[MEMORY] > 0]  # nothing held on a GPU (a CPU run): off the log axis


def _draw_budgets(axes: Any, group: pd.DataFrame) -> None:
    """One model's panel: its budgets' curves, each other variant one point."""
    from matplotlib.ticker import FuncFormatter

    budgeted = group[group["gpu_budget"].notna()]
    others = group[group["gpu_budget"].isna()]
    for (is_delayed, state), curve in budgeted.groupby(list(VARIANTS), sort=True):
        curve = curve.sort_values(MEMORY)
        axes.plot(curve[MEMORY] / GiB, curve[STEP], "--" if is_delayed else "-",
                  color=PALETTE[0], marker="D" if state == "bfloat16" else "o",
                  label="hpcmem under a budget" + variant_label(is_delayed, state))
        for _, point in curve.iterrows():
            axes.annotate(f"{point['gpu_budget'] / GiB:.1f}",
                          (point[MEMORY] / GiB, point[STEP]), textcoords="offset points",
                          xytext=(4, 4), fontsize=8)
    for index, (policy, rows_) in enumerate(others.groupby("policy", sort=True)):
        axes.plot(rows_[MEMORY] / GiB, rows_[STEP], "s", markersize=7,
                  color=PALETTE[1 + index % (len(PALETTE) - 1)], label=policy)
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axes.set_xlabel("GPU memory held (GiB)")
    axes.set_ylabel("step time (ms)")
    log_value_axis(axes)
    # beside the panel, outside its data: its variants are the panel's own
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def budget_figure(points: pd.DataFrame) -> str | None:
    """Step time against GPU memory held per variant, one panel per budgeted model."""
    return grouped_panels(
        budget_points(points), MODEL, _draw_budgets, title=model_title, most_columns=2,
        size=(5.6, 4.2), alt="budget curve: step time against GPU memory held",
        caption="Median step time (ms) against the GPU memory each variant held: hpcmem at "
                "its peak GPU-resident bytes under each budget (the line, each point labelled "
                "with its budget in GiB), the others at PyTorch's peak reserved bytes.")
