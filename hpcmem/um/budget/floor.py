"""A budget's floor: the least one step measurably needs on the GPU, and the refusal of less.

Each strategy's first step (the probe, :class:`~hpcmem.um.budget.phases.Phase`) runs with the
least it can keep on the device and measures its peak; a budget below that peak is refused
(:class:`BudgetTooSmallError`) instead of being silently exceeded. Plans then spend only
``TARGET_FRACTION`` of the budget; the rest absorbs allocator rounding and fragmentation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcmem.um.errors import BudgetError

__all__ = ["TARGET_FRACTION", "BudgetTooSmallError", "check_minimum", "describe_floor"]

#: Share of the budget a plan fills; the rest absorbs allocator rounding and fragmentation.
TARGET_FRACTION = 0.9


class BudgetTooSmallError(BudgetError):
    """The budget is below what one step measurably needs; ``detail`` says what makes up
    that floor and what was already taken off the device."""

    def __init__(self, budget: int, minimum: int, detail: str = "") -> None:
        self.budget = budget
        self.minimum = minimum
        self.detail = detail
        super().__init__(
            f"gpu_budget: {budget} bytes ({budget / 2**30:.2f} GiB) is below the {minimum} "
            f"bytes ({minimum / 2**30:.2f} GiB) the probe step measured as the least one "
            f"step needs on the GPU; give a budget of at least {minimum / 2**30:.2f} GiB "
            f"(or a smaller batch){': ' + detail if detail else ''}"
        )


def check_minimum(budget: int, minimum: int, detail: Callable[[], str] | None = None) -> None:
    """Refuse a budget below the measured ``minimum`` (:class:`BudgetTooSmallError`, with
    ``detail()`` saying what makes it up)."""
    if minimum > budget:
        raise BudgetTooSmallError(budget, minimum, detail() if detail else "")


def describe_floor(held: dict[str, int], token_bytes: int | None, recompute: Any,
                   off: dict[str, int], parts: int) -> str:
    """A floor's make-up for :class:`BudgetTooSmallError`: the device bytes ``held`` by
    use (none left out), a token's activations where measured, the block that held most
    while it recomputed (``recompute.largest``, by its module name),
    and what is off the device already (``off``, the blocks recomputed, the batch's
    ``parts``)."""
    said = [f"{use} {_gib(nbytes)}" for use, nbytes in held.items() if nbytes]
    if token_bytes is not None:
        said.append(f"activations {token_bytes} bytes a token")
    if recompute.largest is not None:
        block, nbytes = recompute.largest
        said.append(f"the largest block {recompute.name_of(block)} ({type(block).__name__}) "
                    f"{_gib(nbytes)} while it recomputes")
    gone = [f"{use} {_gib(nbytes)}" for use, nbytes in off.items()]
    if recompute.enabled:
        gone.append(f"{len(recompute.blocks)} blocks recomputed")
    if parts > 1:
        gone.append(f"the batch in {parts} parts")
    return f"{'; '.join(said)}; already off the device: {', '.join(gone)}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
