"""The collectives' part of the HTML report: latency and bus bandwidth against message size
per op (log-log), one panel per binding with one line per buffer kind on shared axes, each
point's range over its repeats shaded and noisy points ringed, against node count where
several were measured (scaling curves), and each buffer kind's speedup over NumPy buffers
(ratios of noisy points greyed out, not drawn as speedups; emulated HBW said so in every
panel). Legends sit below the panels, outside the data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.scaling import scaling_figures
from hpcmem.collectives.tables import LATENCY, latency_range, latency_table, speedup_table
from hpcmem.draw.html import folded_frame
from hpcmem.draw.plots import PALETTE, grouped_panels, log_size_axis, log_value_axis
from hpcmem.record.samples import NOISY_SPREAD

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["EMULATED_CAVEAT", "latency_figures", "section", "speedup_figure"]

BUS_BANDWIDTH = "busbw_GBps"
NOISY_COLOR = "#b3261e"
GREY = "#9aa3ad"
#: what every panel of a speedup of emulated HBW says: its "HBW" is the same DRAM
EMULATED_CAVEAT = "emulated HBW: same DRAM,\ndifferences are noise"
#: the quantities drawn against size: column, axis label, panel title
_QUANTITIES = ((LATENCY, "average latency (µs)", "latency"),
               (BUS_BANDWIDTH, "bus bandwidth (GB/s)", "bus bandwidth"))
#: panels of one figure, side by side, and the size of each (inches)
_COLUMNS = 3
_PANEL = (3.6, 3.1)
#: size ticks of a panel that narrow
_SIZE_TICKS = 5


def _color(buffer: str) -> str:
    """Each buffer kind's own colour, the same in every figure."""
    index = BUFFER_KINDS.index(buffer) if buffer in BUFFER_KINDS else len(BUFFER_KINDS)
    return PALETTE[index % len(PALETTE)]


def _limits(low: Any, high: Any) -> tuple[float, float]:
    """Shared log-axis limits around the positive values of ``low`` and ``high``."""
    values = [v for v in (*low, *high) if v == v and v > 0]
    if not values:
        return 0.1, 10.0
    bottom, top = min(values), max(values)
    margin = (top / bottom) ** 0.05 if top > bottom else 1.5
    return bottom / margin, top * margin


def _quantity_panels(group: pd.DataFrame, by: str, where: str, op: str, dtype: str
                     ) -> str | None:
    """Panels of one (op, dtype, ranks, nodes): grouped by ``by`` (``quantity``: latency
    and bus bandwidth side by side; ``binding``: one panel per binding of one quantity)."""
    quantity = int(group["quantity"].iloc[0])
    spans = {q: latency_range(group, metric) for q, (metric, _, _) in enumerate(_QUANTITIES)}
    limits = {q: _limits(r["low"], r["high"]) for q, r in spans.items()}

    def draw(axes: Any, panel: pd.DataFrame) -> None:
        which = int(panel["quantity"].iloc[0])
        metric, label, _ = _QUANTITIES[which]
        for buffer, line in panel.groupby("buffer", sort=True):
            _plot_with_range(axes, line.sort_values("size_bytes"), metric,
                             {"color": _color(buffer), "marker": "o", "markersize": 3.5,
                              "linewidth": 1.6, "label": buffer})
        log_size_axis(axes, group["size_bytes"], most=_SIZE_TICKS)
        axes.set_ylim(*limits[which])
        log_value_axis(axes)
        axes.set_ylabel(label)

    def title(key: Any) -> str:
        return (_QUANTITIES[int(key)][2] if by == "quantity" else f"binding {key}")

    name = "latency and bus bandwidth" if by == "quantity" else _QUANTITIES[quantity][2]
    return grouped_panels(
        group, by, draw, title=title, most_columns=_COLUMNS if by == "binding" else 2,
        size=_PANEL if by == "binding" else (5.4, 3.6),
        heading=f"{op} ({dtype}), {where}: {name} against message size", legend="buffer",
        alt=f"{op} {name} against message size, {where}",
        caption=f"{op}, {where}: median over repeats of the average latency across ranks (µs) "
                "and bus bandwidth (GB/s, nccl-tests convention), log-log, same axes in "
                "every panel; shaded: lowest to highest repeat; ringed in red: repeats spread "
                f"more than {NOISY_SPREAD:.0%} of their median (too noisy to judge).")


def latency_figures(points: pd.DataFrame) -> Iterator[str]:
    """Per op, dtype, ranks and node count: latency and bus bandwidth against size, one
    line per buffer kind; one panel per binding (a figure per quantity) where several
    bindings were measured."""
    import pandas as pd

    sized = points[points["size_bytes"] > 0]
    for (op, dtype, ranks, nodes), group in sized.groupby(["op", "dtype", "ranks", "nodes"],
                                                           sort=True, dropna=False):
        where = f"{ranks} ranks" if nodes == 1 else f"{ranks} ranks on {nodes} nodes"
        both = pd.concat([group.assign(quantity=q) for q in range(len(_QUANTITIES))],
                         ignore_index=True)
        if group["binding"].nunique() == 1:
            if (drawn := _quantity_panels(both, "quantity", where, op, dtype)) is not None:
                yield drawn
            continue
        for quantity in range(len(_QUANTITIES)):
            drawn = _quantity_panels(both[both["quantity"] == quantity], "binding", where,
                                     op, dtype)
            if drawn is not None:
                yield drawn


def _plot_with_range(axes: Any, line: pd.DataFrame, metric: str, style: dict[str, Any]
                     ) -> None:
    """One line of medians, its repeats' range lightly shaded, noisy points ringed."""
    spans = latency_range(line, metric)
    axes.plot(line["size_bytes"], line[metric], **style)
    axes.fill_between(line["size_bytes"], spans["low"], spans["high"], color=style["color"],
                      alpha=0.1, linewidth=0)
    noisy = spans["spread"].fillna(0).astype(float) > NOISY_SPREAD
    if noisy.any():
        axes.scatter(line["size_bytes"][noisy], line[metric][noisy], s=70, facecolors="none",
                     edgecolors=NOISY_COLOR, linewidths=1.4, zorder=5)


def _emulated(points: pd.DataFrame) -> bool:
    """Whether any HBW buffer of ``points`` was emulated on plain DRAM."""
    if "emulated" not in points.columns:
        return False
    hbw = points[points["buffer"] != "numpy"]
    return bool(hbw["emulated"].fillna(False).astype(bool).any())


def speedup_figure(points: pd.DataFrame) -> str | None:
    """Each buffer kind's speedup over NumPy buffers against size: one panel per op, ranks
    and binding, one line per buffer kind, on shared axes; every panel says so where its
    HBW was emulated."""
    speed = speedup_table(points)
    speed = speed[speed["size_bytes"] > 0]
    if speed.empty:
        return None
    emulated = _emulated(points)
    ratios = speed["speedup"][speed["speedup"] > 0]
    low, high = _limits(ratios, [1.0])
    logarithmic = high / low > 4  # symmetric for gains and losses; linear for a small range
    if not logarithmic:
        low, high = min(low, 1 - (high - 1) * 0.1), high
    dtypes = speed["dtype"].nunique(dropna=False)

    def draw(axes: Any, panel: pd.DataFrame) -> None:
        for buffer, line in panel.groupby("buffer", sort=True):
            line = line.sort_values("size_bytes")
            trusted = line["speedup"].where(~line["noisy"].astype(bool))
            axes.plot(line["size_bytes"], trusted, marker="o", markersize=3.5, linewidth=1.6,
                      color=_color(buffer), label=buffer)
        noisy = panel[panel["noisy"].astype(bool)]
        if not noisy.empty:
            axes.scatter(noisy["size_bytes"], noisy["speedup"], marker="x", color=GREY, s=30,
                         zorder=4, label="noisy: not a speedup")
        axes.axhline(1.0, color="#555", linewidth=1, linestyle="--")
        log_size_axis(axes, speed["size_bytes"], most=_SIZE_TICKS)
        axes.set_ylim(low, high)
        if logarithmic:
            log_value_axis(axes)
        axes.set_ylabel("speedup (\u00d7)")

    def title(key: Any) -> str:
        op, dtype, ranks, nodes, binding = key
        name = f"{op}{f' ({dtype})' if dtypes > 1 else ''}, {ranks} ranks"
        name += f" on {nodes} nodes" if nodes != 1 else ""
        return f"{name}, {binding}" + (f"\n{EMULATED_CAVEAT}" if emulated else "")

    heading = "speedup over numpy buffers" + (
        ": emulated HBW is the same DRAM, not a result" if emulated else "")
    return grouped_panels(
        speed, ["op", "dtype", "ranks", "nodes", "binding"], draw, title=title,
        most_columns=_COLUMNS, size=(_PANEL[0], _PANEL[1] + (0.3 if emulated else 0)),
        heading=heading, legend="buffer",
        alt="speedup of each buffer kind over numpy buffers by message size",
        caption="Above 1: the buffer kind is faster than plain NumPy buffers at that size "
                "(ratio of median average latencies, dimensionless). Grey crosses: either "
                f"point's repeats spread more than {NOISY_SPREAD:.0%}: a ratio of noise, "
                "not a speedup." + (" Emulated HBW (MEMKIND_HBW_NODES on a DRAM node) "
                                    "allocates the same DRAM as NumPy: any difference here is "
                                    "noise or allocator overhead, not high-bandwidth memory."
                                    if emulated else ""))


def _node_note(points: pd.DataFrame) -> str:
    """How many points shared their cores with other work while measured."""
    shared = points["shared_cores"].fillna(False).astype(bool)
    if not shared.any():
        return '<p class="note">No point shared its cores with other work (or none measured).</p>'
    most = points["other_busy_cpus"].max()
    return (f'<p class="alert"><strong>{int(shared.sum())} of {len(points)} points shared '
            f"their cores</strong> with other work (up to {most:.1f} CPUs busy with something "
            "else): their latencies include waiting for a time slice.</p>")


def section(points: pd.DataFrame) -> str:
    """The collectives' figures and latency table, or a note when there are none."""
    figures = list(latency_figures(points))
    if not figures:
        return '<p class="note">No collectives points in this summary.</p>'
    speed = speedup_figure(points)
    caveat = " (emulated HBW: noise, not a result)" if _emulated(points) else ""
    scaling = list(scaling_figures(points))
    return "\n".join([
        _node_note(points),
        *figures,
        *(["<h3>Scaling with node count</h3>", *scaling] if scaling else []),
        *([f"<h3>Speedup over NumPy buffers{caveat}</h3>", speed] if speed else []),
        folded_frame(latency_table(points), "Latency table (µs, median over repeats)"),
    ])
