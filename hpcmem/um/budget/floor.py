"""A budget's floor: the least one step measurably needs on the GPU, and the refusal of less.

Each strategy's first step (the probe, :class:`~hpcmem.um.budget.phases.Phase`) runs with the
least it can keep on the device and measures its peak; a budget below that peak is refused
(:class:`BudgetTooSmallError`) instead of being silently exceeded. Plans then spend only
``TARGET_FRACTION`` of the budget; the rest absorbs allocator rounding and fragmentation.
"""

from __future__ import annotations

from hpcmem.um.errors import BudgetError

__all__ = ["TARGET_FRACTION", "BudgetTooSmallError", "check_minimum"]

#: Share of the budget a plan fills; the rest absorbs allocator rounding and fragmentation.
TARGET_FRACTION = 0.9


class BudgetTooSmallError(BudgetError):
    """The budget is below what one step measurably needs."""

    def __init__(self, budget: int, minimum: int) -> None:
        self.budget = budget
        self.minimum = minimum
        super().__init__(
            f"gpu_budget: {budget} bytes ({budget / 2**30:.2f} GiB) is below the {minimum} "
            f"bytes ({minimum / 2**30:.2f} GiB) the probe step measured as the least one "
            f"step needs on the GPU; give a budget of at least {minimum / 2**30:.2f} GiB "
            "(or a smaller batch)"
        )


def check_minimum(budget: int, minimum: int) -> None:
    """Refuse a budget below the measured ``minimum`` (:class:`BudgetTooSmallError`)."""
    if minimum > budget:
        raise BudgetTooSmallError(budget, minimum)
