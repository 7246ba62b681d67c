"""The budget strategy a job gets: made from its ``Offload`` value, the plan choosing when
the value names none (:func:`hpcmem.um.offload.choose_strategy`).

Both strategies have one interface: ``scope()`` around forward and backward, ``stats()``,
``reset_stats()``, ``replan()`` and ``close()``; each replaces ``optimizer.step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from hpcmem.um.errors import BudgetError
from hpcmem.um.offload import DELAYED_STREAM, STATE_STREAM, Offload, choose_strategy
from hpcmem.um.stream.transport import Transport
from hpcmem.um.tensors import tensor_bytes

__all__ = ["make_strategy", "working_bytes"]


def working_bytes(model: Any, working_dtype: str | None) -> int:
    """Device bytes of ``model``'s parameters in ``working_dtype`` (None: their own) and of
    its buffers."""
    import torch

    size = getattr(torch, working_dtype).itemsize if working_dtype else None
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * (size or p.element_size()) for p in params)
    return total + sum(tensor_bytes(b) for b in model.buffers())


def make_strategy(
    model: Any,
    optimizer: Any | None,
    *,
    offload: Offload,
    transport: Transport,
    budget: int,
    priority: Sequence[str],
    device_scope: Callable[[], AbstractContextManager[None]],
    plain_scope: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> Any:
    """The strategy ``offload`` names, or the one the plan picks for ``budget``;
    ``device_scope`` routes its device allocations into the budget's pool, ``plain_scope``
    out of every pool (plain device memory)."""
    strategy = offload.strategy or choose_strategy(
        budget,
        working_bytes(model, offload.working_dtype),
        offload.micro_batches,
        type(optimizer).__name__ if optimizer is not None else None,
    )
    if strategy == "host_optimizer":
        from hpcmem.um.host_optimizer import HostOptimizer

        return HostOptimizer(model, optimizer, transport=transport, budget=budget,
                             offload=offload, device_scope=device_scope,
                             plain_scope=plain_scope)
    if offload.delayed_update:
        raise BudgetError(f"{DELAYED_STREAM} (the plan chose stream for this budget)")
    if offload.narrow_state:
        raise BudgetError(f"{STATE_STREAM} (the plan chose stream for this budget)")
    from hpcmem.um.stream import Streamer

    return Streamer(model, optimizer, transport=transport, budget=budget, priority=priority,
                    device_scope=device_scope, recompute=offload.recompute)
