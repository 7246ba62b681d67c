"""Scaling with GPUs, in the training report: throughput and scaling efficiency against the
number of data-parallel GPUs (``hpcmem train --world-size``), as a figure and a table.

A series is one training point but for its GPU count: its key without the ``gpus`` part.
Only a series run at more than one GPU count is shown. Throughput is the record's own: what
one optimizer step trains (global batch x micro-batches x sequence length tokens; images for
the cnn) over the median step time. Scaling efficiency at N GPUs is that throughput over
N/N0 times the throughput at N0, the fewest GPUs of the series that ran (so N times the
one-GPU throughput where one GPU ran): 1 is perfect scaling. A series' failed and skipped
points are rows of the table, with why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import table
from hpcmem.draw.plots import PALETTE, count_axis, embed, log_value_axis, new_figure, outside_legend
from hpcmem.errors import clip
from hpcmem.train.record import THROUGHPUT_UNITS
from hpcmem.train.spec import TRAIN
from hpcmem.train.tables import STEP

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COLUMNS", "scaling_figure", "scaling_table", "section", "series_of"]

#: the key coordinate of a point's GPU count
_GPUS = next(c for c in TRAIN.coordinates if c.name == "world_size")
#: the columns of :func:`scaling_table`
COLUMNS = ["series", "gpus", "status", STEP, "throughput", "unit", "baseline_gpus",
           "efficiency", "reason"]


def series_of(key: str) -> tuple[str, int]:
    """The series of a point key (the key without the benchmark's name and the ``gpus``
    part) and the point's GPU count."""
    prefix = f"{_GPUS.label}="
    parts = key.split("/")[1:]
    gpus = [part.removeprefix(prefix) for part in parts if part.startswith(prefix)]
    series = "/".join(part for part in parts if not part.startswith(prefix))
    return series, _GPUS.parse(gpus[0] if gpus else None)


def _rows(points: pd.DataFrame, left_out: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per point ran (its throughput) and per point failed or skipped (why)."""
    rows = []
    for point in points.to_dict("records"):
        step = float(point[STEP])
        rows.append({"point": point["point"], "status": "ok", STEP: step,
                     "throughput": float(point["throughput"]),
                     "unit": THROUGHPUT_UNITS.get(point["model"], "items/s"), "reason": None})
    rows.extend({"point": str(left["point"]), "status": left["status"],
                 "reason": clip(str(left["reason"]))}
                for left in (left_out.to_dict("records") if len(left_out) else []))
    return rows


def scaling_table(points: pd.DataFrame, left_out: pd.DataFrame) -> pd.DataFrame:
    """The :data:`COLUMNS` of every series run (or left out) at more than one GPU count,
    sorted by series and GPUs; ``points``: the summary's training points, ``left_out``: the
    training records failed or skipped (rows of ``skipped.csv``)."""
    import pandas as pd

    rows = pd.DataFrame(_rows(points, left_out),
                        columns=["point", "status", STEP, "throughput", "unit", "reason"])
    keys = [series_of(key) for key in rows["point"]]
    rows = rows.assign(series=[s for s, _ in keys], gpus=[g for _, g in keys])
    rows = rows[rows.groupby("series")["gpus"].transform("nunique") > 1]
    ran = rows[rows["status"] == "ok"]
    baseline = ran.loc[ran.groupby("series")["gpus"].idxmin(), ["series", "gpus", "throughput"]]
    rows = rows.merge(baseline.rename(columns={"gpus": "baseline_gpus", "throughput": "_base"}),
                      on="series", how="left")
    ideal = rows["gpus"] / rows["baseline_gpus"] * rows["_base"]
    rows = rows.assign(efficiency=rows["throughput"] / ideal)
    return rows.sort_values(["series", "gpus", "status"])[COLUMNS].reset_index(drop=True)


def scaling_figure(scaling: pd.DataFrame) -> str | None:
    """Throughput and scaling efficiency against GPUs, one line per series of
    :func:`scaling_table` (None where no point of any series ran)."""
    ran = scaling[scaling["status"] == "ok"]
    if ran.empty:
        return None
    figure, (speed, efficiency) = new_figure(11, 3.9, columns=2)
    for index, (series, line) in enumerate(ran.groupby("series", sort=True)):
        base = int(line["baseline_gpus"].iloc[0])
        style = {"color": PALETTE[index % len(PALETTE)], "marker": "o", "markersize": 3.5,
                 "linewidth": 1.6, "label": f"{series} (relative to {base} GPU{'s' * (base > 1)})"}
        speed.plot(line["gpus"], line["throughput"], **style)
        efficiency.plot(line["gpus"], line["efficiency"], **style)
    for axes in (speed, efficiency):
        count_axis(axes, sorted(int(n) for n in ran["gpus"].unique()), "GPUs")
    log_value_axis(speed)
    speed.set_ylabel(f"throughput ({' or '.join(sorted(set(ran['unit'])))})")
    speed.set_title("training throughput against GPUs", fontsize=11)
    efficiency.axhline(1.0, color="#555", linewidth=1, linestyle="--")
    efficiency.set_ylim(0, max(1.1, float(ran["efficiency"].max()) * 1.05))
    efficiency.set_ylabel("scaling efficiency")
    efficiency.set_title("scaling efficiency against GPUs", fontsize=11)
    outside_legend(figure, [speed], columns=1, title="training point")
    return embed(
        figure, "training throughput and scaling efficiency against the number of GPUs",
        "Throughput: the tokens (images for the cnn) of one optimizer step, the global batch, "
        "over the median step time of its slowest rank, data-parallel, one rank per GPU, "
        "log-log. Scaling efficiency at N GPUs: throughput at N / (N/N0 x throughput at N0), "
        "N0 the fewest GPUs of the series that ran; 1 (dashed) is perfect scaling.")


def _cells(row: dict[str, Any]) -> list[Any]:
    """One table row as shown: throughput in whole items, efficiency in percent."""
    if row["status"] != "ok":
        return [row["series"], row["gpus"], row["status"], None, None, None, None, row["reason"]]
    return [row["series"], row["gpus"], row["status"], row[STEP],
            f"{row['throughput']:,.0f} {row['unit']}", f"{row['efficiency']:.1%}",
            int(row["baseline_gpus"]), None]


def section(points: pd.DataFrame, left_out: pd.DataFrame) -> str:
    """The scaling figure and its table, or "" where no series ran at two GPU counts."""
    scaling = scaling_table(points, left_out)
    if scaling.empty:
        return ""
    figure = scaling_figure(scaling)
    return "\n".join([
        "<h3>Scaling with GPUs</h3>", *([figure] if figure else []),
        table(("training point", "GPUs", "status", "step (ms, median)", "throughput",
               "scaling efficiency", "relative to (GPUs)", "why not run"),
              [_cells(row) for row in scaling.to_dict("records")],
              ("key", "num", "text", "num", "num", "num", "num", "text"))])
