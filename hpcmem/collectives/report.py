"""The collectives' part of the HTML report: latency and bus bandwidth against message size
per op and buffer kind (log-log), each point's range over its repeats shaded and noisy points
ringed, against node count where several were measured (scaling curves), and each buffer
kind's speedup over NumPy buffers (ratios of noisy points greyed out, not drawn as speedups)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.scaling import scaling_figures
from hpcmem.collectives.tables import LATENCY, latency_range, latency_table, speedup_table
from hpcmem.draw.html import folded_frame
from hpcmem.draw.plots import PALETTE, embed, log_size_axis, log_value_axis, new_figure
from hpcmem.record.samples import NOISY_SPREAD

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["latency_figures", "section", "speedup_figure"]

BUS_BANDWIDTH = "busbw_GBps"
NOISY_COLOR = "#b3261e"
GREY = "#9aa3ad"
#: line style and marker per binding, so buffer kinds keep their colour across bindings
_BINDING_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]


def _color(buffer: str) -> str:
    """Each buffer kind's own colour, the same in every figure."""
    index = BUFFER_KINDS.index(buffer) if buffer in BUFFER_KINDS else len(BUFFER_KINDS)
    return PALETTE[index % len(PALETTE)]


def _series_label(buffer: str, binding: str, bindings: int) -> str:
    return buffer if bindings == 1 else f"{buffer} · {binding}"


def latency_figures(points: pd.DataFrame) -> Iterator[str]:
    """Per op, rank and node count: latency and bus bandwidth against size, one line per
    buffer."""
    sized = points[points["size_bytes"] > 0]
    for (op, dtype, ranks, nodes), group in sized.groupby(["op", "dtype", "ranks", "nodes"],
                                                           sort=True, dropna=False):
        ranks = f"{ranks} ranks" if nodes == 1 else f"{ranks} ranks on {nodes} nodes"
        figure, (lat, bw) = new_figure(11, 3.9, columns=2)
        bindings = sorted(group["binding"].unique())
        for (buffer, binding), line in group.groupby(["buffer", "binding"], sort=True):
            line = line.sort_values("size_bytes")
            index = bindings.index(binding) % len(_BINDING_STYLES)
            linestyle, marker = _BINDING_STYLES[index]
            style = {"color": _color(buffer), "marker": marker, "markersize": 3.5,
                     "linestyle": linestyle, "linewidth": 1.6,
                     "label": _series_label(buffer, binding, len(bindings))}
            for axes, metric in ((lat, LATENCY), (bw, BUS_BANDWIDTH)):
                _plot_with_range(axes, line, metric, style)
        for axes in (lat, bw):
            log_size_axis(axes, group["size_bytes"])
            log_value_axis(axes)
        lat.set_ylabel("average latency (µs)")
        lat.set_title(f"{op} ({dtype}): latency, {ranks}", fontsize=11)
        bw.set_ylabel("bus bandwidth (GB/s)")
        bw.set_title(f"{op} ({dtype}): bus bandwidth, {ranks}", fontsize=11)
        title = "buffer" if len(bindings) == 1 else "buffer · binding"
        lat.legend(title=title, fontsize=9, title_fontsize=9)
        yield embed(
            figure,
            f"{op} latency and bus bandwidth against message size, {ranks}",
            f"{op}, {ranks}: median over repeats of the average latency across ranks (µs) "
            "and bus bandwidth (GB/s, nccl-tests convention), log-log; shaded: lowest to "
            f"highest repeat; ringed in red: repeats spread more than {NOISY_SPREAD:.0%} of "
            "their median (too noisy to judge).",
        )


def _plot_with_range(axes: Any, line: pd.DataFrame, metric: str, style: dict[str, Any]
                     ) -> None:
    """One line of medians, its repeats' range shaded, noisy points ringed."""
    spans = latency_range(line, metric)
    axes.plot(line["size_bytes"], line[metric], **style)
    axes.fill_between(line["size_bytes"], spans["low"], spans["high"], color=style["color"],
                      alpha=0.18, linewidth=0)
    noisy = spans["spread"].fillna(0).astype(float) > NOISY_SPREAD
    if noisy.any():
        axes.scatter(line["size_bytes"][noisy], line[metric][noisy], s=70, facecolors="none",
                     edgecolors=NOISY_COLOR, linewidths=1.4, zorder=5)


def speedup_figure(points: pd.DataFrame) -> str | None:
    """Each buffer kind's speedup over NumPy buffers against size, one line per op."""
    speed = speedup_table(points)
    speed = speed[speed["size_bytes"] > 0]
    if speed.empty:
        return None
    figure, (axes,) = new_figure(11, 3.9)
    bindings, dtypes = speed["binding"].nunique(), speed["dtype"].nunique(dropna=False)
    for (op, dtype, ranks, nodes, binding, buffer), line in speed.groupby(
        ["op", "dtype", "ranks", "nodes", "binding", "buffer"], sort=True, dropna=False
    ):
        line = line.sort_values("size_bytes")
        label = f"{op} · {buffer} · {ranks} ranks" + (f" on {nodes} nodes" if nodes != 1 else "")
        label += f" · {binding}" if bindings > 1 else ""
        label += f" · {dtype}" if dtypes > 1 else ""
        trusted = line["speedup"].where(~line["noisy"].astype(bool))
        axes.plot(line["size_bytes"], trusted, marker="o", markersize=3.5, linewidth=1.6,
                  label=label)
    noisy = speed[speed["noisy"].astype(bool)]
    if not noisy.empty:
        axes.scatter(noisy["size_bytes"], noisy["speedup"], marker="x", color=GREY, s=30,
                     zorder=4, label="noisy: not a speedup")
    axes.axhline(1.0, color="#555", linewidth=1, linestyle="--")
    log_size_axis(axes, speed["size_bytes"])
    if speed["speedup"].max() / speed["speedup"].min() > 4:
        log_value_axis(axes)  # symmetric for gains and losses; linear when the range is small
    axes.set_ylabel("speedup over numpy buffers (\u00d7)")
    axes.set_title("latency of numpy buffers / latency of the buffer kind", fontsize=11)
    axes.legend(fontsize=9, ncols=2)
    return embed(figure, "speedup of each buffer kind over numpy buffers by message size",
                  "Above 1: the buffer kind is faster than plain NumPy buffers at that size "
                  "(ratio of median average latencies, dimensionless). Grey crosses: either "
                  f"point's repeats spread more than {NOISY_SPREAD:.0%}: a ratio of noise, "
                  "not a speedup.")


def _node_note(points: pd.DataFrame) -> str:
    """How many points shared their cores with other work while measured."""
    shared = points["shared_cores"].fillna(False).astype(bool)
    if not shared.any():
        return '<p class="note">No point shared its cores with other work (or none measured).</p>'
    most = points["other_busy_cpus"].max()
    return (f'<p class="note">{int(shared.sum())} of {len(points)} points shared their cores '
            f"with other work (up to {most:.1f} CPUs busy with something else): their "
            "latencies include waiting for a time slice.</p>")


def section(points: pd.DataFrame) -> str:
    """The collectives' figures and latency table, or a note when there are none."""
    figures = list(latency_figures(points))
    if not figures:
        return '<p class="note">No collectives points in this summary.</p>'
    speed = speedup_figure(points)
    scaling = list(scaling_figures(points))
    return "\n".join([
        _node_note(points),
        *figures,
        *(["<h3>Scaling with node count</h3>", *scaling] if scaling else []),
        *(["<h3>Speedup over NumPy buffers</h3>", speed] if speed else []),
        folded_frame(latency_table(points), "Latency table (µs, median over repeats)"),
    ])
