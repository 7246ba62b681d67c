"""The collectives' part of the native-against-container section: the same points run
natively and in the image, and the container's overhead (container latency / native
latency) per op, buffer, binding and message size. Above 1 the container is slower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.collectives.tables import LATENCY
from hpcmem.draw.html import folded_frame, table
from hpcmem.draw.plots import PALETTE, embed, log_size_axis, log_value_axis, new_figure

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["overhead_section", "overhead_table"]

#: what identifies a collectives point in both summaries
KEYS = ["op", "dtype", "ranks", "binding", "buffer", "size_bytes", "nodes"]
#: one line style per op, so lines of the same colour stay apart
_LINES = ("-", "--", ":", "-.")


def overhead_table(container: pd.DataFrame, native: pd.DataFrame) -> pd.DataFrame:
    """Points measured both ways: their median average latencies (µs) and the overhead ratio."""
    import pandas as pd

    def latencies(coll: pd.DataFrame, name: str) -> pd.DataFrame:
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


def overhead_section(container: pd.DataFrame, native: pd.DataFrame) -> str:
    """The report's body for collectives points run both in the image and natively: the
    overhead figure, per-op figures and the full table (a note when none was run both ways)."""
    overhead = overhead_table(container, native)
    if overhead.empty:
        return '<p class="note">No point was measured both ways.</p>'
    return "".join([_overhead_figure(overhead), _per_op(overhead),
                    folded_frame(overhead, "Overhead table (µs, median over repeats)")])
