"""The training part of the HTML report: step time per Unified Memory policy, one panel per
model point, with the p10-p90 spread and the ratio to the ``um`` preset; and, for models run
under a GPU budget, the budget curve (:mod:`hpcmem.train.budget_curve`) and where each
budgeted step's time goes (:mod:`hpcmem.train.time_bars`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import folded_frame
from hpcmem.draw.plots import PALETTE, grouped_panels
from hpcmem.train.budget_curve import budget_figure
from hpcmem.train.tables import MODEL_POINT, STEP, model_title, step_time_table
from hpcmem.train.time_bars import time_figure
from hpcmem.um import PRESETS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["section", "training_figure"]


def _color(policy: str) -> str:
    """Each preset's own colour, the same in every panel; policy files share the next one."""
    presets = list(PRESETS)
    index = presets.index(policy) if policy in presets else len(presets)
    return PALETTE[index % len(PALETTE)]


def _wrapped(policy: str, width: int = 8) -> str:
    """A policy's name broken after an underscore into lines of about ``width``
    characters, so that the names of neighbouring bars never run into each other."""
    lines = [""]
    for part in policy.split("_"):
        if lines[-1] and len(lines[-1]) + 1 + len(part) > width:
            lines.append(part)
        else:
            lines[-1] = f"{lines[-1]}_{part}" if lines[-1] else part
    return "_\n".join(lines)


def _draw_policies(axes: Any, group: pd.DataFrame) -> None:
    """One model point's panel: a bar per policy, its p10-p90 whiskers and ratio to ``um``."""
    import pandas as pd

    policies = list(group["policy"])
    median = group[STEP].to_numpy(dtype=float)
    spread = [median - group["step_ms.p10"].to_numpy(dtype=float),
              group["step_ms.p90"].to_numpy(dtype=float) - median]
    colors = [_color(p) for p in policies]
    axes.bar(policies, median, yerr=spread, capsize=5, color=colors, width=0.6,
             error_kw={"elinewidth": 1, "ecolor": "#333"})
    tops = group["step_ms.p90"].to_numpy(dtype=float)
    for x, (value, top, ratio) in enumerate(zip(median, tops, group["ratio_to_um"], strict=True)):
        text = f"{value:.1f} ms" + ("" if pd.isna(ratio) else f"\n{ratio:.2f}\u00d7 um")
        axes.annotate(text, (x, top), textcoords="offset points", xytext=(0, 4),
                      ha="center", va="bottom", fontsize=8)
    axes.margins(y=0.2)
    axes.set_xticks(range(len(policies)), [_wrapped(p) for p in policies])
    axes.set_ylabel("step time (ms)")
    axes.set_xlabel("memory policy")
    axes.grid(True, axis="y", alpha=0.3)


def training_figure(points: pd.DataFrame) -> str | None:
    """Median step time per policy with the p10-p90 spread, one panel per model point."""
    return grouped_panels(
        step_time_table(points), MODEL_POINT, _draw_policies, title=model_title,
        most_columns=3, size=(4.2, 3.9), alt="training step time per memory policy",
        caption="Median step time (ms) per policy, with its ratio to the um policy (UM "
                "without advice); whiskers span p10-p90 of step times (medians over repeats).")


def section(points: pd.DataFrame) -> str:
    """The training figure and step-time table, or a note when there are no points."""
    figure = training_figure(points)
    if figure is None:
        return '<p class="note">No training points in this summary.</p>'
    table = folded_frame(step_time_table(points), "Step time table (ms, median over repeats)")
    budgeted = [drawn for drawn in (budget_figure(points), time_figure(points)) if drawn]
    return "\n".join([figure, table, *budgeted])
