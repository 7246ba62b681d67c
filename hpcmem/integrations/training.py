"""What the trainer integrations share: the ``Offload`` a trainer's settings make, attaching
its model and optimizer, and the settings a GPU budget cannot honour.

Under a budget the strategy (:mod:`hpcmem.um.strategy`) owns the weights and the optimizer
state from ``attach`` to ``close``: a trainer must not move the model to the GPU, and what
reads or writes that state behind the strategy's back is refused up front, not left to go
silently wrong:

* gradient clipping under ``host_optimizer`` (the gradients have left for the host, bucket by
  bucket, by the time a trainer clips them: it would clip nothing);
* a loss scaler (fp16: it reads the gradients after backward);
* evaluation (the strategies place the weights for training steps only).

Over several data-parallel ranks each rank's memory must be on that rank's GPU
(:func:`check_device`); the strategy takes the default process group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcmem.um.budget.offload import Offload
from hpcmem.um.errors import BudgetError, UnifiedMemoryError
from hpcmem.um.memory import MemoryScopes

__all__ = ["attach", "check_device", "refuse_under_budget", "trainer_offload"]


def trainer_offload(offload: Offload | None, *, micro_batches: int, bf16: bool) -> Offload:
    """The ``Offload`` a trainer attaches with: ``offload`` with the trainer's gradient
    accumulation as its micro-batches or, when None, the plan's choice with working weights
    in bf16 under bf16 autocast. An ``offload`` naming other micro-batches is refused."""
    if offload is None:
        return Offload(working_dtype="bfloat16" if bf16 else None, micro_batches=micro_batches)
    if offload.micro_batches not in (1, micro_batches):
        raise BudgetError(
            f"offload micro_batches={offload.micro_batches}: the trainer accumulates "
            f"{micro_batches} micro-batches per optimizer step; leave micro_batches out (the "
            "trainer's count is taken)"
        )
    return replace(offload, micro_batches=micro_batches)


def attach(
    memory: MemoryScopes,
    model: Any,
    optimizer: Any,
    *,
    offload: Offload | None,
    micro_batches: int,
    bf16: bool,
    clip_norm: float | None,
    clip_option: str,
) -> None:
    """Attach a trainer's model and optimizer to ``memory``; under a budget with
    :func:`trainer_offload`'s value, refusing the trainer's gradient clipping
    (``clip_option`` = ``clip_norm``) where the strategy steps on the host."""
    if memory.gpu_budget is None:
        memory.attach(model, optimizer)
        return
    memory.attach(model, optimizer,
                  offload=trainer_offload(offload, micro_batches=micro_batches, bf16=bf16))
    if clip_norm and memory.stats()["offload"]["strategy"] == "host_optimizer":
        raise BudgetError(
            f"{clip_option}={clip_norm}: under offload strategy host_optimizer the gradients "
            "leave the GPU as autograd finishes them and are stepped on the host, so the "
            f"trainer cannot clip them; set {clip_option} to 0 (or pass "
            "StreamedOffload())"
        )
    from hpcmem.um.strategy import Planned

    if clip_norm and isinstance(memory.strategy, Planned):
        memory.strategy.keep()  # never handed to the host optimizer, which would not clip


def refuse_under_budget(memory: MemoryScopes, setting: str, why: str, fix: str) -> None:
    """Raise :class:`BudgetError` for a trainer ``setting`` that ``memory``'s budget cannot
    honour (a no-op without a budget)."""
    if memory.gpu_budget is not None:
        raise BudgetError(f"{setting}: {why} under a gpu_budget; {fix}")


def check_device(memory: MemoryScopes, device: Any, setting: str) -> None:
    """Refuse a trainer whose rank trains on another GPU (``device``, its ``setting``) than
    ``memory``'s: a rank's memory is on that rank's GPU."""
    if device.type == "cuda" and device.index not in (None, memory.device_index):
        raise UnifiedMemoryError(
            f"UnifiedMemory device={memory.device_index}: this rank trains on {device} "
            f"({setting}); accepted: device={device.index}, the rank's GPU (LOCAL_RANK)"
        )
