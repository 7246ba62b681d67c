"""The budget strategy a job gets: the one its :class:`~hpcmem.um.budget.offload.Offload`
value's type names, or the one the plan picks for a plain ``Offload``
(:func:`~hpcmem.um.budget.offload.choose_strategy`). Every strategy keeps the
:class:`~hpcmem.um.budget.protocol.BudgetStrategy` contract and replaces ``optimizer.step``.
Over several ranks (:func:`~hpcmem.um.budget.parallel.data_parallel`) only the host
optimizer runs; the streamed strategy is refused.

A planned strategy whose probe step refuses the budget hands the job to the other one
(:class:`Planned`), where host memory holds the other's homes beside the first's: the
host optimizer keeps the whole working weights on the device but splits a batch into rows,
the streamed strategy keeps one layer but runs a batch whole, so either may fit where the
other does not. Nothing has been stepped by then: the probe's gradients go over with the
model (:mod:`hpcmem.um.host_optimizer.pending`), and the loop's ``optimizer.step()`` steps
them. The record names the strategy refused and why (``stats()["fallback"]``).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from hpcmem.um.budget.batch_split import BatchSplit
from hpcmem.um.budget.floor import BudgetTooSmallError
from hpcmem.um.budget.host_memory import available_host_bytes
from hpcmem.um.budget.offload import (
    ELEMENTWISE,
    HostOptimizerOffload,
    Offload,
    StreamedOffload,
    choose_strategy,
    lazy_state_tensors,
)
from hpcmem.um.budget.parallel import data_parallel
from hpcmem.um.budget.protocol import BudgetStrategy
from hpcmem.um.budget.transport import Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.tensors import tensor_bytes

__all__ = ["Planned", "make_strategy", "planned", "working_bytes"]

_log = logging.getLogger(__name__)


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
    release_device_cache: Callable[[], None] = lambda: None,
) -> BudgetStrategy:
    """The strategy for ``offload`` (see the module docstring); ``device_scope`` routes its
    device allocations into the budget's pool, ``plain_scope`` out of every pool (plain
    device memory); ``process_group`` the ranks it trains over (None: the default group if
    ``torch.distributed`` is initialised); ``batch_split`` the causal LM's split, which the
    host optimizer plans (the streamed strategy runs batches whole); ``release_device_cache``
    gives back what the device scope keeps cached, between one strategy and the next."""
    chosen = planned(offload, model, optimizer, budget)
    ranks = data_parallel(process_group, transport.device)

    def build(value: Offload) -> BudgetStrategy:
        if isinstance(value, HostOptimizerOffload):
            from hpcmem.um.host_optimizer import HostOptimizer

            return HostOptimizer(model, optimizer, transport=transport, budget=budget,
                                 offload=value, device_scope=device_scope,
                                 plain_scope=plain_scope, ranks=ranks, batch_split=batch_split)
        if ranks is not None:
            how = ("asked" if offload.strategy else "planned: the host optimizer's fixed "
                   "device bytes pass half the budget, or the optimizer is not SGD, Adam or "
                   "AdamW")
            raise BudgetError(f"offload strategy: 'streamed' ({how}) runs one rank, not world "
                              f"size {ranks.size}; accepted with data parallelism: "
                              "host_optimizer")
        from hpcmem.um.streamed import Streamer

        return Streamer(model, optimizer, transport=transport, budget=budget,
                        priority=priority, device_scope=device_scope,
                        recompute=value.recompute, state_dtype=value.state_dtype,
                        working_dtype=value.working_dtype)

    name = type(optimizer).__name__ if optimizer is not None else None
    if offload.strategy is not None or ranks is not None or name not in ELEMENTWISE:
        return build(chosen)
    other = (StreamedOffload if isinstance(chosen, HostOptimizerOffload)
             else HostOptimizerOffload)(**offload.shared())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    homes = trained * 4 * (2 + lazy_state_tensors(optimizer))
    return Planned(build, chosen, other, host_bytes=homes,
                   release_device_cache=release_device_cache)


class Planned:
    """The strategy the plan picked and, where its probe step refuses the budget, the
    other one (module docstring); every other attribute is the strategy's in force."""

    def __init__(self, build: Callable[[Offload], BudgetStrategy], chosen: Offload,
                 other: Offload, *, host_bytes: int,
                 release_device_cache: Callable[[], None] = lambda: None) -> None:
        self._build = build
        self._release_device_cache = release_device_cache
        self.current = build(chosen)
        self._name = chosen.strategy  # of the strategy in force
        self._other: Offload | None = other
        self._host_bytes = host_bytes  # the other's homes: gradient, master (or parameter), state
        self._refusal: BudgetTooSmallError | None = None  # the first strategy's
        self._first = ""  # its name

    @property
    def plain_bytes(self) -> int:
        return self.current.plain_bytes

    def __getattr__(self, name: str) -> Any:
        current = self.__dict__.get("current")
        if current is None:
            raise AttributeError(name)
        return getattr(current, name)

    @contextmanager
    def scope(self) -> Iterator[None]:
        """The strategy's scope; a probe's refusal hands the job over, or is raised with
        what the other strategy refused too. A strategy refuses after the probe's forward
        and backward (they ran: their gradients go over), or on entering the next scope,
        after the probe's optimizer step (the step is done: the other takes it from there)."""
        ran = False
        try:
            with ExitStack() as stack:
                try:
                    stack.enter_context(self.current.scope())
                except BudgetTooSmallError as refused:
                    self._refused(refused)
                    stack.enter_context(self.current.scope())
                yield
                ran = True
        except BudgetTooSmallError as refused:
            if not ran:  # the loop's own, or raised above
                raise
            self._refused(refused)

    def _refused(self, refused: BudgetTooSmallError) -> None:
        """Hand the job over after ``refused``, or raise it (with the other's, if any)."""
        if self._refusal is not None:
            raise _both((self._first, self._refusal), (self._name, refused)) from None
        if self._other is None:
            raise refused
        self._hand_over(refused)

    def keep(self) -> None:
        """No hand-over: the job relies on what the strategy in force does (a trainer that
        clips gradients, which the host optimizer does not let it)."""
        self._other = None

    def _hand_over(self, refused: BudgetTooSmallError) -> None:
        other, self._other = self._other, None
        first = self._name
        available = available_host_bytes()
        if available is not None and self._host_bytes > available:
            raise BudgetTooSmallError(refused.budget, refused.minimum, (
                f"{refused.detail}; strategy {other.strategy} not tried: its host homes "
                f"need about {self._host_bytes / 2**30:.1f} GiB beside {first}'s, "
                f"{available / 2**30:.1f} GiB are available")) from None
        _log.warning("gpu_budget: strategy %s refused %.2f GiB (floor %.2f GiB); the job "
                     "goes on with strategy %s", first, refused.budget / 2**30,
                     refused.minimum / 2**30, other.strategy)
        self.current.close()
        self.current = None
        gc.collect()  # its device memory freed before the other's probe measures the device
        self._release_device_cache()  # and not kept cached beside the other's
        try:
            self.current = self._build(other)
        except BudgetError as error:  # the model is back on the host, as after close()
            raise BudgetTooSmallError(refused.budget, refused.minimum, (
                f"{refused.detail}; strategy {other.strategy} could not take over: "
                f"{error}")) from error
        self._refusal = refused
        self._first, self._name = first, other.strategy

    def stats(self) -> dict[str, Any]:
        stats = self.current.stats()
        if self._refusal is not None:
            stats["fallback"] = {"refused_by": self._first, "floor_bytes":
                                 self._refusal.minimum, "why": str(self._refusal)}
        return stats

    def reset_stats(self) -> None:
        self.current.reset_stats()

    def replan(self) -> dict[str, int]:
        return self.current.replan()

    def close(self) -> None:
        if self.current is not None:  # None: the other could not take over
            self.current.close()


def _both(*refusals: tuple[str, BudgetTooSmallError]) -> BudgetTooSmallError:
    """One refusal naming each strategy's floor, in the order tried, the lower as the least."""
    name, low = min(refusals, key=lambda refusal: refusal[1].minimum)
    floors = ", ".join(f"{n} {e.minimum / 2**30:.2f} GiB" for n, e in refusals)
    return BudgetTooSmallError(low.budget, low.minimum,
                               f"both strategies refused it ({floors}); {name}'s floor: "
                               f"{low.detail}")
