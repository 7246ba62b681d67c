"""One training point end to end: check the device, size the model, train, build the record."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from hpcmem.errors import HpcmemError
from hpcmem.node.state import BusyCpus, load_average, node_state
from hpcmem.train.point import TrainPoint
from hpcmem.train.ranks import Launch, gather, host_peak_bytes, start, stop
from hpcmem.train.record import merged_record, ok_record, unfinished_record

if TYPE_CHECKING:
    import torch

    from hpcmem.train.models import CNNShape, TransformerShape

__all__ = [
    "NoGPUError",
    "environment",
    "no_gpu_reason",
    "run_point",
    "shape_for_memory",
    "shape_for_params",
    "train_point",
]


class NoGPUError(HpcmemError, RuntimeError):
    """The point needs a CUDA GPU and this machine has none."""


def no_gpu_reason(device: torch.device) -> str | None:
    """Why ``device`` cannot run here, or None when it can."""
    import torch

    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built for CUDA {torch.version.cuda}, but no device is visible"
        )
        return f"no CUDA GPU on {socket.gethostname()} (torch {torch.__version__}: {build})"
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        return f"--device {device}: this machine has {count} CUDA device(s)"
    return None


def environment(device: torch.device) -> dict[str, Any]:
    """GPU name, torch and CUDA versions, and the device's total memory in bytes."""
    import torch

    if device.type != "cuda":
        return {"gpu": "none", "torch": torch.__version__, "cuda": torch.version.cuda,
                "device_memory_bytes": 0}
    properties = torch.cuda.get_device_properties(device)
    return {
        "gpu": properties.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_memory_bytes": properties.total_memory,
    }


def shape_for_params(point: TrainPoint) -> TransformerShape | CNNShape:
    """The shape for ``params_requested``; SizingError when none comes within 10%."""
    from hpcmem.train.models import CNN_WIDTHS, CNNShape, cnn_shape, transformer_shape
    from hpcmem.train.sizing import PARAMS_TOLERANCE, SizingError

    target = point.params_requested
    if point.model == "cnn":
        shape: TransformerShape | CNNShape = cnn_shape(target, point.image_size or 224)
        smallest = CNNShape(width=CNN_WIDTHS[0], image_size=shape.image_size).param_count()
        hint = f"the smallest CNN (width {CNN_WIDTHS[0]}) has {smallest:,}"
    else:
        assert target and point.seq_len and point.vocab
        shape = transformer_shape(target, point.seq_len, point.vocab)
        hint = f"the embeddings of --vocab {point.vocab} alone need {point.vocab * 64:,}"
    if target is not None and abs(shape.param_count() / target - 1) > PARAMS_TOLERANCE:
        raise SizingError(
            f"--params: {target:,} is out of reach for the {point.model}: the nearest shape has "
            f"{shape.param_count():,} parameters ({hint}; accepted: a count the model can "
            f"come within {PARAMS_TOLERANCE:.0%} of)"
        )
    return shape


def shape_for_memory(point: TrainPoint, device: torch.device) -> TransformerShape | CNNShape:
    """The largest shape whose footprint fits ``oversubscribe`` x free memory of ``device``."""
    import torch

    from hpcmem.train.sizing import SizingError, size_for_footprint

    assert point.oversubscribe is not None
    if device.type != "cuda":
        raise SizingError("--oversubscribe: sizing to free GPU memory needs a CUDA --device")
    free, _total = torch.cuda.mem_get_info(device)
    return size_for_footprint(
        point.model,
        int(point.oversubscribe * free),
        batch=point.batch,
        dtype=point.dtype,
        seq_len=point.seq_len or 0,
        vocab=point.vocab or 0,
        image_size=point.image_size or 0,
    )


def run_point(
    point: TrainPoint,
    *,
    policy: Any,
    allow_oversubscription: bool,
    skip_if_no_gpu: bool,
    launch: Launch | None = None,
) -> dict[str, Any]:
    """Run ``point`` under ``policy`` (a ``hpcmem.um`` policy) and return its record.

    Raises NoGPUError when the point needs a GPU this machine lacks (unless
    ``skip_if_no_gpu``: then the record is ``skipped``), SizingError for a point
    that cannot be sized. Running out of memory gives a ``failed`` record. Under
    ``launch`` (:mod:`hpcmem.train.ranks`) this process is one data-parallel rank, on its
    launcher's GPU (or the CPU): every rank returns the record merged from all of theirs
    (:func:`~hpcmem.train.record.merged_record`).
    """
    import dataclasses

    import torch

    from hpcmem.node import applied
    from hpcmem.train.data import synthetic_data
    from hpcmem.train.models import CNN_CLASSES
    from hpcmem.um import UnifiedMemory

    binding = applied.current()
    device = torch.device(point.device)
    shape = shape_for_params(point) if point.oversubscribe is None else None
    reason = no_gpu_reason(device)
    if reason is not None:
        if skip_if_no_gpu:
            return unfinished_record(point, "skipped", reason, policy=policy.to_record(),
                                     binding=binding)
        raise NoGPUError(f"{reason}; run on a GPU node, or pass --skip-if-no-gpu to record "
                         "a skipped point")
    group = None
    if launch is not None:
        device, group = start(launch, device.type)
        point = dataclasses.replace(point, device=str(device))
    if shape is None:
        shape = shape_for_memory(point, device)
    data = synthetic_data(
        point.model,
        batch=point.batch,
        seq_len=point.seq_len or 0,
        vocab=point.vocab or 0,
        image_size=point.image_size or 0,
        classes=CNN_CLASSES,
        seed=point.seed,
    )
    memory = UnifiedMemory(
        policy,
        device=device.index or 0,
        gpu_budget=point.gpu_budget,
        allow_oversubscription=allow_oversubscription,
    )
    busy = BusyCpus(tuple(binding["cpus"]), processes=1)
    busy.mark(time.process_time())
    load_before = load_average()
    shard = None if launch is None else (launch.rank, launch.world_size)
    record = train_point(point, shape, data, memory, device=device, binding=binding,
                         shard=shard)
    record["node"] = node_state(binding["cpus"], 1, load_before=load_before,
                                other_busy_cpus=busy.mark(time.process_time()))
    if launch is None:
        return record
    record["host_peak_bytes"] = host_peak_bytes()
    every = gather(record, group)
    stop()
    return merged_record(every)


def train_point(
    point: TrainPoint,
    shape: Any,
    data: Any,
    memory: Any,
    *,
    device: Any,
    binding: dict[str, Any],
    unconstrained_ms: float | None = None,
    pinned_inputs: bool = False,
    offload: str | None = None,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Train ``point`` (model ``shape``, batches from ``data``) under ``memory``, a
    ``hpcmem.um.UnifiedMemory``, and return its record; ``memory`` is closed afterwards.
    Running out of memory (the guard's refusal included), or a budget below what the probe
    step measured, gives a ``failed`` record;
    ``unconstrained_ms`` (the step time without a budget) goes into a budgeted record's
    PCIe bound; ``pinned_inputs`` stages pinned batches, ``offload`` names the budget
    strategy and ``shard`` this data-parallel rank (see ``hpcmem.train.loop.train``)."""
    import torch

    from hpcmem.train.loop import train
    from hpcmem.train.sizing import footprint
    from hpcmem.um.budget.floor import BudgetTooSmallError

    policy = memory.policy.to_record()
    try:
        result = train(shape, data, memory, device=device, dtype=point.dtype,
                       steps=point.steps, warmup=point.warmup, seed=point.seed,
                       pinned_inputs=pinned_inputs, offload=offload,
                       accumulate=point.accumulate, delayed_update=point.delayed_update,
                       state_dtype=point.state_dtype, shard=shard)
    except torch.OutOfMemoryError as error:
        first_line = str(error).strip().splitlines()[0]
        return unfinished_record(point, "failed", f"out of memory: {first_line}",
                                 policy=policy, binding=binding)
    except BudgetTooSmallError as error:
        record = unfinished_record(point, "failed", str(error), policy=policy, binding=binding)
        record["budget_minimum_bytes"] = error.minimum
        return record
    finally:
        memory.close()
    record = ok_record(
        point,
        shape=shape,
        result=result,
        policy=policy,
        footprint=footprint(shape, point.batch, point.dtype),
        environment=environment(device),
        binding=binding,
        unconstrained_ms=unconstrained_ms,
    )
    if pinned_inputs:
        record["pinned_inputs"] = True
    return record
