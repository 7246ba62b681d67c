"""What the training benchmark's records hold, declared once for the results pipeline.

A point is (model, parameters asked for, batch, micro-batches per step, sequence length,
dtype, GPU budget, delayed update, memory policy); its key reads
``train/<model>/params=<n>/batch=<n>[/accum=<n>]/seq=<n|none>/<dtype>/budget=<bytes|none>[/delayed=True]/policy=<name>[/gpus=<n>]``
(``accum`` only when a step accumulates more than one micro-batch, ``delayed`` only for
ZeRO-Offload's delayed update, ``hpcmem train --delayed-update``, ``gpus`` only for
data-parallel ranks, ``hpcmem train --world-size``).
A workflow job sweeps model, params, budget, policy and GPU count (its folder:
``<model>/params=<n>/budget=<bytes|none>/policy=<name>[/gpus=<n>]``, ``gpus`` only above
one); batch, sequence length and dtype follow from the model or the sweep's settings.
Median and first step times are checked in every run.
"""

from __future__ import annotations

from typing import Any

from hpcmem.record.spec import HIGHER, LOWER, Benchmark, Coordinate, Metric
from hpcmem.train.models import MODELS
from hpcmem.train.point import default_params
from hpcmem.train.sizing import DTYPES

__all__ = ["TRAIN"]


def _params(record: Any) -> Any:
    """The size asked for is the coordinate; an ok record also carries the exact count. A
    model left at its default size has its default count, so a skipped or failed point of the
    cnn (whose default is ResNet-50's exact count) has the key of its ok records."""
    asked = record.get("params_requested") or record.get("params")
    if asked is None and record.get("oversubscribe") is None and record.get("model") in MODELS:
        return default_params(record["model"])
    return asked


def _policy(record: Any) -> Any:
    policy = record.get("policy")
    return policy.get("name") if isinstance(policy, dict) else policy


TRAIN = Benchmark(
    name="train",
    coordinates=(
        Coordinate("model", swept=True, option="--model"),
        Coordinate("params", "params", integer=True, read=_params, swept=True,
                   option="--params", default=lambda point: default_params(point["model"])),
        Coordinate("batch", "batch", integer=True),
        # micro-batches per optimizer step; records made before the axis ran one
        Coordinate("accumulate", "accum", integer=True, implied=1,
                   read=lambda record: record.get("accumulate", 1)),
        Coordinate("seq_len", "seq", missing="none", integer=True),
        Coordinate("dtype"),
        Coordinate("gpu_budget", "budget", missing="none", integer=True, nullable=True,
                   swept=True, option="--gpu-budget"),
        # ZeRO-Offload's one-step delayed update; records made before the axis had none
        Coordinate("delayed_update", "delayed", implied=False,
                   read=lambda record: bool(record.get("delayed_update", False))),
        # the dtype of Adam's moments on the host; records made before the axis: fp32
        Coordinate("state_dtype", "state", implied="float32",
                   read=lambda record: record.get("state_dtype", "float32")),
        Coordinate("policy", "policy", read=_policy, swept=True, option="--policy"),
        # data-parallel ranks, one GPU each; records made before the axis ran one
        Coordinate("world_size", "gpus", integer=True, implied=1,
                   read=lambda record: record.get("world_size", 1), swept=True,
                   option="--world-size", default=lambda point: 1),
    ),
    metrics=(
        Metric("step_ms.median", "ms", LOWER, checked=True),
        Metric("step_ms.p10", "ms", LOWER),
        Metric("step_ms.p90", "ms", LOWER),
        Metric("first_step_ms", "ms", LOWER, checked=True),
        Metric("throughput", "items/s", HIGHER),  # tokens or images: throughput_unit says
        Metric("oversubscription", "ratio", None),  # managed bytes / device memory
        # budgeted runs only: what the budget strategy moved per step and held, and its bound
        Metric("bytes_h2d", "bytes", LOWER, required=False),
        Metric("bytes_d2h", "bytes", LOWER, required=False),
        Metric("peak_gpu_resident_bytes", "bytes", LOWER, required=False),
        Metric("pcie_transfer_ms", "ms", LOWER, required=False),
        Metric("pcie_bound_ms", "ms", LOWER, required=False),
        # the design-independent floor: working weights in and their gradients out once
        Metric("pcie_floor_ms", "ms", LOWER, required=False),
        # the host-optimizer strategy: where its step's time goes, and the bound they allow
        Metric("compute_ms", "ms", LOWER, required=False),
        Metric("backward_ms", "ms", LOWER, required=False),
        Metric("h2d_busy_ms", "ms", LOWER, required=False),
        Metric("d2h_busy_ms", "ms", LOWER, required=False),
        Metric("cpu_optimizer_ms", "ms", LOWER, required=False),
        Metric("step_bound_ms", "ms", LOWER, required=False),
        # PyTorch's peak reserved bytes: any run on a GPU (None on the CPU)
        Metric("peak_reserved_bytes", "bytes", LOWER, required=False,
               schema={"type": ["number", "null"], "minimum": 0}),
    ),
    fields={
        "required": ["model", "params", "batch", "dtype", "policy", "bytes_by_type", "gpu",
                     "torch", "cuda"],
        "properties": {
            "model": {"enum": list(MODELS)},
            "params": {"type": "integer", "minimum": 1},
            "batch": {"type": "integer", "minimum": 1},
            "seq_len": {"type": ["integer", "null"]},
            "dtype": {"enum": list(DTYPES)},
            "policy": {"type": "object", "required": ["name"]},
            "bytes_by_type": {"type": "object"},
            "gpu": {"type": "string"},
            "torch": {"type": "string"},
            "cuda": {"type": ["string", "null"]},
        },
    },
    metadata={"gpus": "gpu", "torch": "torch", "cuda": "cuda"},
)
