"""What the training benchmark's records hold, declared once for the results pipeline.

A point is (model, parameters asked for, batch, sequence length, dtype, GPU budget,
memory policy); its key reads
``train/<model>/params=<n>/batch=<n>/seq=<n|none>/<dtype>/budget=<bytes|none>/policy=<name>``.
Median and first step times are checked in every run.
"""

from __future__ import annotations

from typing import Any

from hpcmem.record.spec import HIGHER, LOWER, Benchmark, Coordinate, Metric
from hpcmem.train.models import MODELS
from hpcmem.train.sizing import DTYPES

__all__ = ["TRAIN"]


def _params(record: Any) -> Any:
    """The size asked for is the coordinate; an ok record also carries the exact count."""
    return record.get("params_requested") or record.get("params")


def _policy(record: Any) -> Any:
    policy = record.get("policy")
    return policy.get("name") if isinstance(policy, dict) else policy


TRAIN = Benchmark(
    name="train",
    coordinates=(
        Coordinate("model"),
        Coordinate("params", "params", integer=True, read=_params),
        Coordinate("batch", "batch", integer=True),
        Coordinate("seq_len", "seq", missing="none", integer=True),
        Coordinate("dtype"),
        Coordinate("gpu_budget", "budget", missing="none", integer=True),
        Coordinate("policy", "policy", read=_policy),
    ),
    metrics=(
        Metric("step_ms.median", "ms", LOWER, checked=True),
        Metric("step_ms.p10", "ms", LOWER),
        Metric("step_ms.p90", "ms", LOWER),
        Metric("first_step_ms", "ms", LOWER, checked=True),
        Metric("throughput", "items/s", HIGHER),  # tokens or images: throughput_unit says
        Metric("oversubscription", "ratio", None),  # managed bytes / device memory
        # budgeted runs only: what the streaming mode moved per step and held, and its bound
        Metric("bytes_h2d", "bytes", LOWER, required=False),
        Metric("bytes_d2h", "bytes", LOWER, required=False),
        Metric("peak_gpu_resident_bytes", "bytes", LOWER, required=False),
        Metric("pcie_transfer_ms", "ms", LOWER, required=False),
        Metric("pcie_bound_ms", "ms", LOWER, required=False),
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
