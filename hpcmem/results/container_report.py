"""The report's native-against-container section: the same collectives points run natively
and in the image, and the container's overhead (container latency / native latency) per op,
buffer, binding and message size. Above 1 the container is slower.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from hpcmem.collectives.tables import LATENCY
from hpcmem.results.aggregate import benchmark_points
from hpcmem.results.plots import PALETTE, embed, log_size_axis, log_value_axis, new_figure
from hpcmem.results.report_template import folded_frame, section, table

if TYPE_CHECKING:
    import pandas as pd

    from hpcmem.results.aggregate import Summary

__all__ = ["container_section", "overhead_table"]

#: what identifies a collectives point in both summaries
KEYS = ["op", "dtype", "ranks", "binding", "buffer", "size_bytes", "nodes"]
#: one line style per op, so lines of the same colour stay apart
_LINES = ("-", "--", ":", "-.")


def overhead_table(container: pd.DataFrame, native: pd.DataFrame) -> pd.DataFrame:
    """Points measured both ways: their median average latencies (µs) and the overhead ratio."""
    import pandas as pd

    def latencies(points: pd.DataFrame, name: str) -> pd.DataFrame:
        coll = benchmark_points(points, "collectives")
        if LATENCY not in coll.columns:
            return pd.DataFrame(columns=[*KEYS, name])
        coll = coll[coll[LATENCY].notna()]
        return coll[[*KEYS, LATENCY]].rename(columns={LATENCY: name})

    both = latencies(container, "container_us").merge(latencies(native, "native_us"), on=KEYS)
    both["overhead"] = both["container_us"] / both["native_us"]
    columns = [*KEYS, "native_us", "container_us", "overhead"]
    return both[columns].sort_values(KEYS, ignore_index=True)


def _overhead_figure(overhead: pd.DataFrame) -> str:
    """The overhead ratio against message size, one line per op, buffer and binding."""
    figure, (axes,) = new_figure(11, 4.8)
    ops = sorted(overhead["op"].unique())
    for number, ((op, buffer, binding, ranks), line) in enumerate(overhead.groupby(
        ["op", "buffer", "binding", "ranks"], sort=True
    )):
        line = line.sort_values("size_bytes")
        label = f"{op} · {buffer} · binding {binding} · {ranks} ranks"
        axes.plot(line["size_bytes"], line["overhead"], marker="o", markersize=3.5,
                  linewidth=1.6, label=label, color=PALETTE[number % len(PALETTE)],
                  linestyle=_LINES[ops.index(op) % len(_LINES)])  # fmt: skip
    axes.axhline(1.0, color="#555", linewidth=1, linestyle="--")
    log_size_axis(axes, overhead["size_bytes"])
    if overhead["overhead"].max() / overhead["overhead"].min() > 4:
        log_value_axis(axes)  # symmetric for faster and slower; linear when the range is small
    axes.set_ylabel("container / native latency (\u00d7)")
    axes.set_title("container overhead by message size", fontsize=11)
    figure.legend(fontsize=8, ncols=3, loc="outside lower center")  # below: lines stay visible
    return embed(figure, "container overhead ratio by message size",
                  "Median average latency in the image divided by the same point run natively "
                  "(dimensionless); above 1 the container is slower.")  # fmt: skip


def _per_op(overhead: pd.DataFrame) -> str:
    """Per op: median, lowest and highest overhead over its sizes, buffers and bindings."""
    rows = [
        [op, len(group), group["overhead"].median(), group["overhead"].min(),
         group["overhead"].max()]
        for op, group in overhead.groupby("op", sort=True)
    ]  # fmt: skip
    headers = ["op", "points", "median overhead", "lowest", "highest"]
    return table(headers, rows, ["text", "num", "num", "num", "num"])


def _image_line(containers: list[dict[str, Any]]) -> str:
    parts = []
    for box in containers:
        runtime = " ".join(str(box.get(k)) for k in ("runtime", "runtime_version") if box.get(k))
        parts.append(f"<code>{html.escape(str(box.get('image')))}</code> "
                     f"({html.escape(str(box.get('digest')))}"
                     + (f", {html.escape(runtime)}" if runtime else "") + ")")  # fmt: skip
    return ", ".join(parts)


def container_section(summary: Summary, native: Summary) -> str:
    """The section: which image, the overhead figure, per-op figures and the full table."""
    containers = summary.metadata.get("containers") or []
    title = "Native against container"
    if not containers:
        return section(title, '<p class="note">The sweep ran natively (no image could be built '
                       "or run; the workflow said why), so there is no overhead to show.</p>",
                       anchor="container")  # fmt: skip
    overhead = overhead_table(summary.points, native.points)
    hosts = html.escape(", ".join(native.metadata.get("hosts") or []))
    intro = (f"<p>The same collectives points ran in {_image_line(containers)} and natively on "
             f"{hosts}; the overhead is the container's latency over the native one.</p>")
    if overhead.empty:
        return section(title, intro, '<p class="note">No point was measured both ways.</p>',
                       anchor="container")  # fmt: skip
    return section(title, intro, _overhead_figure(overhead), _per_op(overhead),
                   folded_frame(overhead, "Overhead table (µs, median over repeats)"),
                   anchor="container")  # fmt: skip
