"""Tables of the collectives' summary points: latency by buffer kind, speedup over NumPy.

Each takes the summary rows of this benchmark (``hpcmem aggregate`` writes them as
``collectives_latency.csv`` and ``collectives_speedup.csv``; the report shows them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.record.samples import NOISY_SPREAD, read_samples, spread

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BASELINE_BUFFER", "LATENCY", "latency_range", "latency_table", "speedup_table"]

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


def latency_range(points: pd.DataFrame, metric: str = LATENCY) -> pd.DataFrame:
    """Per point, the lowest and highest repeat of ``metric`` (``low``, ``high``; the point's
    own value where it has no samples) and their ``spread`` ((max - min) / median)."""
    import pandas as pd

    rows = []
    for value, text in zip(points[metric], points["samples"], strict=True):
        values = read_samples(text).get(metric) or [value]
        rows.append({"low": min(values), "high": max(values), "spread": spread(values)})
    return pd.DataFrame(rows, index=points.index, columns=["low", "high", "spread"])


def _noisy(spreads: pd.Series) -> pd.Series:
    return spreads.fillna(0).astype(float) > NOISY_SPREAD


def speedup_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per op and size, each other buffer kind's speedup over NumPy buffers
    (NumPy's latency / its latency). ``noisy``: the repeats of either point spread more than
    ``NOISY_SPREAD``: the ratio is then not a speedup anyone can rely on."""
    import pandas as pd

    columns = [*_KEYS, "buffer", "latency_us", "numpy_latency_us", "speedup", "noisy"]
    base = points[points["buffer"] == BASELINE_BUFFER]
    other = points[points["buffer"] != BASELINE_BUFFER]
    if base.empty or other.empty:
        return pd.DataFrame(columns=columns)
    base = base.assign(noisy=_noisy(latency_range(base)["spread"]))
    other = other.assign(noisy=_noisy(latency_range(other)["spread"]))
    merged = other[[*_KEYS, "buffer", LATENCY, "noisy"]].merge(
        base[[*_KEYS, LATENCY, "noisy"]], on=_KEYS, suffixes=("", "_numpy")
    )
    merged = merged.rename(columns={LATENCY: "latency_us", f"{LATENCY}_numpy": "numpy_latency_us"})
    merged["speedup"] = merged["numpy_latency_us"] / merged["latency_us"]
    merged["noisy"] = merged["noisy"] | merged["noisy_numpy"]
    return merged[columns].sort_values([*_KEYS[:5], "buffer", "size_bytes"]).reset_index(drop=True)
