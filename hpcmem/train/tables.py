"""The training summary's table: step time per policy and its ratio to the ``um`` and ``cuda``
presets (``hpcmem aggregate`` writes it as ``train_step_time.csv``; the report shows it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BASELINES", "MODEL", "MODEL_POINT", "STEP", "step_time_table"]

#: the presets every policy is compared with: managed memory without advice, PyTorch's own
BASELINES = ("um", "cuda")
#: the coordinates of a model point: everything but the policy
#: a model's coordinates: a point without its budget and policy
MODEL = ["model", "params", "batch", "seq_len", "dtype"]
MODEL_POINT = [*MODEL, "gpu_budget"]
#: the metric the ratios are taken of
STEP = "step_ms.median"


def step_time_table(points: pd.DataFrame) -> pd.DataFrame:
    """Step times per model point and policy, with ``ratio_to_um`` and ``ratio_to_cuda``."""
    columns = [*MODEL_POINT, "policy", STEP, "step_ms.p10", "step_ms.p90", "first_step_ms",
               "repeats"]
    table = points[columns].copy()
    for preset in BASELINES:
        baseline = table.loc[table["policy"] == preset, [*MODEL_POINT, STEP]]
        baseline = baseline.rename(columns={STEP: f"_{preset}"})
        table = table.merge(baseline, on=MODEL_POINT, how="left")
        table[f"ratio_to_{preset}"] = table[STEP] / table[f"_{preset}"]
        table = table.drop(columns=f"_{preset}")
    return table.reset_index(drop=True)
