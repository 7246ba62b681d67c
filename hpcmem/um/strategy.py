"""The budget strategy a job gets: the one its :class:`~hpcmem.um.budget.offload.Offload`
value's type names, or the one the plan picks for a plain ``Offload``
(:func:`~hpcmem.um.budget.offload.choose_strategy`). Every strategy keeps the
:class:`~hpcmem.um.budget.protocol.BudgetStrategy` contract and replaces ``optimizer.step``.
Over several ranks (:func:`~hpcmem.um.budget.parallel.data_parallel`) only the host
optimizer runs; the streamed strategy is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from hpcmem.um.budget.batch_split import BatchSplit
from hpcmem.um.budget.offload import (
    HostOptimizerOffload,
    Offload,
    StreamedOffload,
    choose_strategy,
)
from hpcmem.um.budget.parallel import data_parallel
from hpcmem.um.budget.protocol import BudgetStrategy
from hpcmem.um.budget.transport import Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.tensors import tensor_bytes

__all__ = ["make_strategy", "planned", "working_bytes"]


def working_bytes(model: Any, working_dtype: str | None) -> int:
    """Device bytes of ``model``'s parameters in ``working_dtype`` (None: their own) and of
    its buffers."""
    import torch

    size = getattr(torch, working_dtype).itemsize if working_dtype else None
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * (size or p.element_size()) for p in params)
    return total + sum(tensor_bytes(b) for b in model.buffers())


def planned(offload: Offload, model: Any, optimizer: Any | None, budget: int) -> Offload:
    """``offload`` as the value of a strategy: itself when its type names one, else the
    strategy the plan picks for ``budget``, with ``offload``'s shared fields."""
    if offload.strategy is not None:
        return offload
    name = choose_strategy(
        budget,
        working_bytes(model, offload.working_dtype),
        offload.micro_batches,
        type(optimizer).__name__ if optimizer is not None else None,
    )
    kind = HostOptimizerOffload if name == "host_optimizer" else StreamedOffload
    return kind(**offload.shared())


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
    process_group: Any = None,
    batch_split: BatchSplit | None = None,
) -> BudgetStrategy:
    """The strategy for ``offload`` (see the module docstring); ``device_scope`` routes its
    device allocations into the budget's pool, ``plain_scope`` out of every pool (plain
    device memory); ``process_group`` the ranks it trains over (None: the default group if
    ``torch.distributed`` is initialised); ``batch_split`` the causal LM's split, which the
    host optimizer plans (the streamed strategy runs batches whole)."""
    chosen = planned(offload, model, optimizer, budget)
    ranks = data_parallel(process_group, transport.device)
    if isinstance(chosen, HostOptimizerOffload):
        from hpcmem.um.host_optimizer import HostOptimizer

        return HostOptimizer(model, optimizer, transport=transport, budget=budget,
                             offload=chosen, device_scope=device_scope,
                             plain_scope=plain_scope, ranks=ranks, batch_split=batch_split)
    if ranks is not None:
        how = ("asked" if offload.strategy else "planned: the host optimizer's fixed device "
               "bytes pass half the budget, or the optimizer is not SGD, Adam or AdamW")
        raise BudgetError(f"offload strategy: 'streamed' ({how}) runs one rank, not world "
                          f"size {ranks.size}; accepted with data parallelism: host_optimizer")
    from hpcmem.um.streamed import Streamer

    return Streamer(model, optimizer, transport=transport, budget=budget, priority=priority,
                    device_scope=device_scope, recompute=chosen.recompute)
