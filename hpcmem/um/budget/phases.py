"""The phases of a budgeted job's steps, the same for every strategy: probe, measure, steady."""

from __future__ import annotations

import enum

__all__ = ["Phase"]


class Phase(enum.Enum):
    """Where a step stands in a budget strategy's life."""

    #: the first step: the least is kept on the device, its peak measured (the floor)
    PROBE = "probe"
    #: the steps after it up to the strategy's plan: measured, the plan made from them
    MEASURE = "measure"
    #: every later step: the plan in force
    STEADY = "steady"

    @classmethod
    def of(cls, step: int, plan_after: int) -> Phase:
        """The phase of the ``step``-th step (1-based) of a strategy that plans after its
        ``plan_after``-th step."""
        if step == 1:
            return cls.PROBE
        return cls.MEASURE if step <= plan_after else cls.STEADY
