"""The contract every budget strategy keeps: what :class:`~hpcmem.um.managed.ManagedMemory`
holds once ``attach`` hands it the model and optimizer.

A strategy replaces ``optimizer.step``; :meth:`BudgetStrategy.scope` wraps forward and
backward. Both see the same host buffers (:mod:`hpcmem.um.budget.host`) and the same
transport (:mod:`hpcmem.um.budget.transport`); data parallelism's group and shards are
shared too (:mod:`hpcmem.um.budget.parallel`), and the host optimizer reduces its buckets
over them (the streamed strategy runs one rank).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["BudgetStrategy"]


class BudgetStrategy(Protocol):
    """A model and optimizer trained within a GPU budget."""

    #: device bytes the strategy holds outside the budget's pool (plain device memory)
    plain_bytes: int

    def scope(self) -> AbstractContextManager[None]:
        """Context: one forward and backward under the budget."""
        ...

    def stats(self) -> dict[str, Any]:
        """What the steps moved and held; ``strategy`` names the strategy."""
        ...

    def reset_stats(self) -> None:
        """Counts and peaks from now on (e.g. after warm-up)."""
        ...

    def replan(self) -> dict[str, int]:
        """Plan again from what the steps measured; the bytes given to each use."""
        ...

    def close(self) -> None:
        """Give the model and optimizer back (their state in host memory)."""
        ...
