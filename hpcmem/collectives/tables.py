"""Tables of the collectives' summary points: latency by buffer kind, speedup over NumPy.

Each takes the summary rows of this benchmark (``hpcmem aggregate`` writes them as
``collectives_latency.csv`` and ``collectives_speedup.csv``; the report shows them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BASELINE_BUFFER", "LATENCY", "latency_table", "speedup_table"]

#: the buffer kind every other one is compared with: plain NumPy memory
BASELINE_BUFFER = "numpy"
#: the metric both tables are made of
LATENCY = "latency_us.avg"
_KEYS = ["op", "dtype", "ranks", "nodes", "binding", "size_bytes"]


def latency_table(points: pd.DataFrame) -> pd.DataFrame:
    """Median average latency (µs) by op, dtype, ranks, nodes, binding and size; a column per
    buffer."""
    import pandas as pd

    if points.empty:
        return pd.DataFrame(columns=_KEYS)
    table = points.pivot_table(
        index=_KEYS, columns="buffer", values=LATENCY, aggfunc="first", dropna=False
    )
    table.columns.name = None
    return table.add_prefix("latency_us_").reset_index()


def speedup_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per op and size, each other buffer kind's speedup over NumPy buffers
    (NumPy's latency / its latency)."""
    import pandas as pd

    columns = [*_KEYS, "buffer", "latency_us", "numpy_latency_us", "speedup"]
    base = points[points["buffer"] == BASELINE_BUFFER]
    other = points[points["buffer"] != BASELINE_BUFFER]
    if base.empty or other.empty:
        return pd.DataFrame(columns=columns)
    merged = other[[*_KEYS, "buffer", LATENCY]].merge(
        base[[*_KEYS, LATENCY]], on=_KEYS, suffixes=("", "_numpy")
    )
    merged = merged.rename(columns={LATENCY: "latency_us", f"{LATENCY}_numpy": "numpy_latency_us"})
    merged["speedup"] = merged["numpy_latency_us"] / merged["latency_us"]
    return merged[columns].sort_values([*_KEYS[:5], "buffer", "size_bytes"]).reset_index(drop=True)
