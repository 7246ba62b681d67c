"""The ``train`` result record: one JSON object per point (its fields: :mod:`hpcmem.train.spec`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from hpcmem.record.provenance import common_fields
from hpcmem.train.point import TrainPoint
from hpcmem.train.ranks import largest, mean_steps, slowest_steps
from hpcmem.train.sizing import DTYPES
from hpcmem.train.spec import TRAIN
from hpcmem.um import TYPES

if TYPE_CHECKING:
    from hpcmem.train.loop import TrainResult
    from hpcmem.train.models import CNNShape, TransformerShape
    from hpcmem.train.sizing import Footprint

__all__ = ["RANK_PEAKS", "THROUGHPUT_UNITS", "merged_record", "ok_record", "stream_fields",
           "unfinished_record"]

#: What a budget strategy's statistics say of its steps, copied into the record.
ACCOUNTING = ("strategy", "fallback", "compute_ms", "backward_ms", "cpu_optimizer_ms",
              "h2d_busy_ms", "d2h_busy_ms", "step_bound_ms")
#: A rank's memory figures, kept per rank and, at their largest, in the merged record.
RANK_PEAKS = ("peak_reserved_bytes", "nvml_peak_bytes", "held_peak_bytes", "host_peak_bytes")
#: Throughput unit per model.
THROUGHPUT_UNITS = {"transformer": "tokens/s", "cnn": "images/s"}


def _point_fields(point: TrainPoint, policy: dict[str, Any]) -> dict[str, Any]:
    fields = asdict(point)
    fields["policy"] = policy
    fields["params"] = point.params_requested
    return fields


def unfinished_record(
    point: TrainPoint,
    status: str,
    reason: str,
    *,
    policy: dict[str, Any],
    binding: dict[str, Any],
) -> dict[str, Any]:
    """A ``skipped`` (cannot run here: no GPU) or ``failed`` (out of memory) record.

    ``policy`` is ``policy.to_record()``, as in a finished run's record.
    """
    return {
        **common_fields(TRAIN, binding=binding, status=status, reason=reason),
        **_point_fields(point, policy),
    }


def stream_fields(memory: dict[str, Any], unconstrained_ms: float | None,
                  working_bytes: int) -> dict[str, Any]:
    """What a run under a GPU budget moved and held, and its PCIe bound.

    ``bytes_h2d``/``bytes_d2h``: bytes the budget strategy copied per timed step;
    ``peak_gpu_resident_bytes``: the most bytes placed on the GPU at once;
    ``pcie_transfer_ms``: those bytes at the pinned-copy bandwidth measured in the same run;
    ``pcie_bound_ms``: the larger of that and the unconstrained step time, when known;
    ``pcie_floor_ms``: what any design moves, ``working_bytes`` (the weights in the compute
    dtype) in and their gradients out once per step, at the same rates, both ways at once.
    The host-optimizer strategy adds where its time goes (``ACCOUNTING``), per step.
    """
    offload = memory.get("offload")
    if not offload:
        return {}
    transfer = offload["pcie_transfer_ms"]
    rates = offload["pcie_bandwidth"]
    accounting = {f"offload_{k}" if k == "strategy" else k: offload[k]
                  for k in ACCOUNTING if k in offload}
    return {
        **accounting,
        "bytes_h2d": offload["bytes_h2d"],
        "bytes_d2h": offload["bytes_d2h"],
        "peak_gpu_resident_bytes": memory["peak_gpu_resident_bytes"],
        "pcie_bandwidth": offload["pcie_bandwidth"],
        "pcie_transfer_ms": transfer,
        "unconstrained_step_ms": unconstrained_ms,
        "pcie_bound_ms": transfer if unconstrained_ms is None else max(transfer, unconstrained_ms),
        "pcie_floor_ms": max(working_bytes / rates["h2d"], working_bytes / rates["d2h"]) * 1e3,
    }


def ok_record(
    point: TrainPoint,
    *,
    shape: TransformerShape | CNNShape,
    result: TrainResult,
    policy: dict[str, Any],
    footprint: Footprint,
    environment: dict[str, Any],
    binding: dict[str, Any],
    unconstrained_ms: float | None = None,
) -> dict[str, Any]:
    """The record of a finished run.

    ``policy`` is ``policy.to_record()``; ``environment`` carries ``gpu``,
    ``torch``, ``cuda`` and ``device_memory_bytes`` (the device's total memory,
    the denominator of ``oversubscription``). ``bytes_by_type`` holds each
    type's peak managed bytes (None per type under the unmanaged ``cuda``
    policy, whose total is in ``peak_reserved_bytes``). A run under a GPU budget
    adds :func:`stream_fields` (``unconstrained_ms``: the same model's step time
    without a budget, for the PCIe bound).
    """
    memory = result.memory
    device_memory = environment["device_memory_bytes"]
    managed = memory.get("managed_bytes", 0)
    return {
        **common_fields(TRAIN, binding=binding),
        **_point_fields(point, policy),
        "params": shape.param_count(),
        "shape": asdict(shape),
        "step_ms": asdict(result.timed),
        "first_step_ms": result.first_step_ms,
        "step_ms_all": result.step_ms,
        "throughput": result.throughput(),
        "throughput_unit": THROUGHPUT_UNITS[point.model],
        "bytes_by_type": {
            name: memory[name]["peak_bytes"] if memory.get(name) else None
            for name in TYPES
        },
        "escaped_bytes": memory["escaped_bytes"],
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "nvml_peak_bytes": result.nvml_peak_bytes,
        "nvml_device_peak_bytes": result.nvml_device_peak_bytes,
        "held_peak_bytes": result.held_peak_bytes,
        "memory": memory,
        "footprint_estimate": footprint.to_record(),
        "oversubscription": managed / device_memory if device_memory else 0.0,
        "losses": result.loss_ends(),
        **stream_fields(memory, unconstrained_ms, shape.param_count() * DTYPES[point.dtype]),
        **environment,
    }


def merged_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every data-parallel rank's, in rank order: rank 0's, with
    ``world_size``; failed where any rank failed or did not finish, its ``reason`` naming
    each such rank and its host; each step's time on its slowest rank (``step_ms_all``,
    ``step_ms``, ``first_step_ms``, and the global batch's ``throughput`` at that median);
    the losses averaged over the ranks (each trained its rows of the global batch); each of
    :data:`RANK_PEAKS` at its largest; and ``ranks``: each rank's host, status, median step,
    peaks and bytes communicated."""
    from hpcmem.train.loop import step_stats

    base = dict(records[0])
    failed = [(rank, r) for rank, r in enumerate(records) if r["status"] != "ok"]
    base["world_size"] = len(records)
    base["ranks"] = [{"rank": rank, "host": r.get("host"), "status": r["status"],
                      "step_ms": (r.get("step_ms") or {}).get("median"),
                      "bytes_communicated": ((r.get("memory") or {}).get("offload") or {}
                                             ).get("bytes_communicated"),
                      **{name: r.get(name) for name in RANK_PEAKS}}
                     for rank, r in enumerate(records)]
    if failed:
        base.update(status="failed", reason="; ".join(
            f"rank {rank} on {r.get('host')}: {r.get('reason')}" for rank, r in failed))
        return base
    slowest = slowest_steps([r["step_ms_all"] for r in records])
    timed = step_stats(slowest[base["warmup"]:])
    base.update(step_ms_all=slowest, first_step_ms=slowest[0], step_ms=asdict(timed),
                throughput=base["throughput"] * base["step_ms"]["median"] / timed.median,
                losses={end: mean_steps([r["losses"][end] for r in records])
                        for end in base["losses"]})
    base.update({name: largest([r.get(name) for r in records]) for name in RANK_PEAKS})
    return base
