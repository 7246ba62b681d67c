"""The training summary's table: step time per policy and its ratio to the ``um`` and ``cuda``
presets (``hpcmem aggregate`` writes it as ``train_step_time.csv``; the report shows it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.units import format_count

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BASELINES", "DELAYED", "MODEL", "MODEL_POINT", "STATE", "STEP", "VARIANTS",
           "model_title", "step_time_table", "variant_label", "with_variants"]

#: the presets every policy is compared with: managed memory without advice, PyTorch's own
BASELINES = ("um", "cuda")
#: a model's coordinates: a point without its budget and policy
MODEL = ["model", "params", "batch", "seq_len", "dtype", "accumulate"]
#: ZeRO-Offload's one-step delayed update (budgeted points only)
DELAYED = "delayed_update"
#: the dtype of Adam's moments on the host (budgeted points only)
STATE = "state_dtype"
#: the budget mode's opt-in variants, each with the value a summary made before it implies
VARIANTS = {DELAYED: False, STATE: "float32"}
#: the coordinates of a model point: everything but the policy
MODEL_POINT = [*MODEL, "gpu_budget", *VARIANTS]
#: the metric the ratios are taken of
STEP = "step_ms.median"


def variant_label(delayed_update: Any, state_dtype: Any, separator: str = ", ") -> str:
    """What a budgeted point opted into, for a title or a label ("" for neither)."""
    parts = (["delayed update"] if delayed_update is True else []) + (
        ["bf16 moments"] if state_dtype == "bfloat16" else [])
    return "".join(separator + part for part in parts)


def model_title(key: tuple[Any, ...]) -> str:
    """A panel's title for the values of :data:`MODEL` (and a budget and the
    :data:`VARIANTS` after them, if any)."""
    import pandas as pd

    model, params, batch, _seq_len, dtype, accumulate, *budget = key
    micro = "" if pd.isna(accumulate) or accumulate == 1 else f" x {accumulate} micro-batches"
    title = f"{model}, {format_count(params)} params, batch {batch}{micro}, {dtype}"
    if budget and not pd.isna(budget[0]):  # on a line of its own: the panels are narrow
        title += f",\nbudget {float(budget[0]) / 2**30:.3g} GiB"
    return title + variant_label(*budget[1:3]) if len(budget) == 3 else title


def with_variants(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with the :data:`VARIANTS` columns (their implied values where a summary
    made before an axis lacks it)."""
    filled = {name: points[name].fillna(value) if name in points else value
              for name, value in VARIANTS.items()}
    if DELAYED in points:
        filled[DELAYED] = filled[DELAYED].astype(bool)
    return points.assign(**filled)


def step_time_table(points: pd.DataFrame) -> pd.DataFrame:
    """Step times per model point and policy, with ``ratio_to_um`` and ``ratio_to_cuda``."""
    columns = [*MODEL_POINT, "policy", STEP, "step_ms.p10", "step_ms.p90", "first_step_ms",
               "repeats"]
    table = with_variants(points)[columns].copy()
    for preset in BASELINES:
        baseline = table.loc[table["policy"] == preset, [*MODEL_POINT, STEP]]
        baseline = baseline.rename(columns={STEP: f"_{preset}"})
        table = table.merge(baseline, on=MODEL_POINT, how="left")
        table[f"ratio_to_{preset}"] = table[STEP] / table[f"_{preset}"]
        table = table.drop(columns=f"_{preset}")
    return table.reset_index(drop=True)
