"""One training point as asked for: its sweep coordinates and run settings, validated.

Points come from ``hpcmem train``, so a value that is not accepted raises
:class:`PointError` naming that command's option, the value and what is accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.train.models import DEFAULT_VOCAB, MODELS, cnn_shape
from hpcmem.train.sizing import DTYPES
from hpcmem.um.budget.offload import STATE_DTYPES
from hpcmem.units import UnitError, parse_count, parse_size

__all__ = ["DEFAULTS", "MODEL_OPTIONS", "PointError", "TrainPoint", "check_policy",
           "default_params", "make_point"]

#: What each model uses for the options left out.
DEFAULTS = {
    "transformer": {"params": "125M", "batch": 8, "dtype": "bf16", "seq_len": 2048,
                    "vocab": DEFAULT_VOCAB},
    "cnn": {"params": None, "batch": 256, "dtype": "fp32", "image_size": 224},
}
#: Options that shape only one model's data.
MODEL_OPTIONS = {"transformer": ("seq_len", "vocab"), "cnn": ("image_size",)}
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class PointError(HpcmemError, ValueError):
    """A training option whose value is not accepted; the message names the option."""


@dataclass(frozen=True)
class TrainPoint:
    """What was asked for: the sweep coordinates and run settings of one training point."""

    model: str
    params_requested: int | None
    oversubscribe: float | None
    batch: int
    seq_len: int | None  # transformer only
    vocab: int | None  # transformer only
    image_size: int | None  # cnn only
    dtype: str
    policy: str  # preset name or YAML path
    gpu_budget: int | None
    steps: int
    warmup: int
    seed: int
    device: str
    accumulate: int = 1  # micro-batches of ``batch`` samples per optimizer step
    #: ZeRO-Offload's one-step delayed update, budgets only
    #: (``HostOptimizerOffload(delayed_update=True)``)
    delayed_update: bool = False
    #: the dtype of Adam's moments on the host, budgets only (``Offload(state_dtype=...)``)
    state_dtype: str = "float32"
    #: data-parallel ranks (one GPU each); ``batch`` is then split evenly between them
    world_size: int = 1


def default_params(model: str) -> int:
    """The parameter count of ``model`` when --params is left out: the transformer's
    default target, or ResNet-50's exact count (its size does not depend on the images).

    >>> default_params("transformer"), default_params("cnn")
    (125000000, 25557032)
    """
    params = DEFAULTS[model]["params"]
    if params is None:
        return cnn_shape(None, DEFAULTS[model]["image_size"]).param_count()
    return parse_count(params)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _at_least(name: str, value: int, minimum: int = 1) -> int:
    if value < minimum:
        raise PointError(f"{_option(name)}: {value} is not an integer >= {minimum}")
    return value


def _one_of(name: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise PointError(f"{_option(name)}: {value!r} is not one of {', '.join(accepted)}")
    return value


#: the narrowest transformer (one head of 64): each token and position costs this many weights
_NARROWEST = 64


def _check_tables(chosen: dict[str, int], params: int) -> None:
    """Blame a --seq-len or --vocab that was chosen, not --params, when its table alone
    outgrows the model."""
    for name, rows in chosen.items():
        if rows * _NARROWEST > params:
            raise PointError(
                f"{_option(name)}: {rows:,} needs a table of {rows * _NARROWEST:,} parameters "
                f"at least, more than the {params:,} of --params (accepted: at most "
                f"{params // _NARROWEST:,})"
            )


def make_point(
    *,
    model: str = "transformer",
    params: str | None = None,
    oversubscribe: float | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    image_size: int | None = None,
    dtype: str | None = None,
    policy: str = "hpcmem",
    gpu_budget: str | None = None,
    steps: int = 20,
    warmup: int = 3,
    seed: int = 0,
    device: str = "cuda:0",
    accumulate: int = 1,
    delayed_update: bool = False,
    state_dtype: str = "float32",
    world_size: int = 1,
) -> TrainPoint:
    """The point these options describe; None takes the model's default (:data:`DEFAULTS`).

    ``params`` is a count (``125M``, ``1.3B``) and ``gpu_budget`` a size (``40G``).
    Raises :class:`PointError` naming the first option that is not accepted.
    """
    given = {"seq_len": seq_len, "vocab": vocab, "image_size": image_size}
    model = _one_of("model", model, MODELS)
    for other, names in MODEL_OPTIONS.items():
        for name in names:
            if other != model and given[name] is not None:
                raise PointError(f"{_option(name)}: applies to --model {other} only, not {model}")
    defaults = DEFAULTS[model]

    def value(name: str, chosen: Any) -> Any:
        return defaults[name] if chosen is None else chosen

    if params is not None and oversubscribe is not None:
        raise PointError("--params and --oversubscribe: give one of them, not both")
    if oversubscribe is not None and (not math.isfinite(oversubscribe) or oversubscribe <= 0):
        raise PointError(f"--oversubscribe: {oversubscribe!r} is not a positive ratio")
    count = None if oversubscribe is not None else value("params", params)
    try:
        params_requested = None if count is None else parse_count(count)
    except UnitError as error:
        raise PointError(f"--params: {error}") from None
    try:
        budget = None if gpu_budget is None else parse_size(gpu_budget, positive=True)
    except UnitError as error:
        raise PointError(f"--gpu-budget: {error}") from None
    if delayed_update and budget is None:
        raise PointError("--delayed-update: applies under --gpu-budget only (it delays the "
                         "host optimizer's update); give a --gpu-budget or leave it out")
    state_dtype = _one_of("state_dtype", state_dtype, STATE_DTYPES)
    if state_dtype != "float32" and budget is None:
        raise PointError(f"--state-dtype: {state_dtype} applies under --gpu-budget only (the "
                         "moments' host homes); give a --gpu-budget or leave it out")
    if not _DEVICE.fullmatch(device):
        raise PointError(f"--device: {device!r} is not one of cuda, cuda:N, cpu")
    transformer, cnn = model == "transformer", model == "cnn"
    micro_batch = _at_least("batch", value("batch", batch))
    if micro_batch % world_size:
        raise PointError(f"--batch: {micro_batch} samples do not split evenly between "
                         f"{world_size} ranks (--world-size); accepted: a multiple of "
                         f"{world_size}")
    if transformer and params_requested is not None:
        _check_tables({name: given[name] for name in ("seq_len", "vocab")
                       if given[name] is not None}, params_requested)
    return TrainPoint(
        model=model,
        params_requested=params_requested,
        oversubscribe=oversubscribe,
        batch=micro_batch,
        seq_len=_at_least("seq_len", value("seq_len", seq_len)) if transformer else None,
        vocab=_at_least("vocab", value("vocab", vocab), 2) if transformer else None,
        image_size=_at_least("image_size", value("image_size", image_size), 32) if cnn else None,
        dtype=_one_of("dtype", value("dtype", dtype), tuple(DTYPES)),
        policy=policy,
        gpu_budget=budget,
        steps=_at_least("steps", steps),
        warmup=_at_least("warmup", warmup, 0),
        seed=_at_least("seed", seed, 0),
        device=device,
        accumulate=_at_least("accumulate", accumulate),
        delayed_update=delayed_update,
        state_dtype=state_dtype,
        world_size=world_size,
    )


def check_policy(point: TrainPoint, policy: Any) -> None:
    """Refuse a loaded ``hpcmem.um`` policy the point cannot run under, before any GPU work."""
    if point.device == "cpu" and policy.managed:
        raise PointError(f"--policy: {point.policy!r} needs a CUDA device; --device cpu "
                         "(for tests) runs only with --policy cuda")
    if point.gpu_budget is not None and not policy.managed:
        raise PointError(f"--gpu-budget: needs a Unified Memory policy (um, hpcmem or a "
                         f"managed YAML file); {policy.name!r} is PyTorch's own allocator")
