"""The phases of the host-optimizer mode's steps: probe, measure, steady."""

from __future__ import annotations

import enum

__all__ = ["PLAN_AFTER", "Phase"]

#: The step after which the GPU's share is planned, from the median of the steps since the
#: first (the probe): on the H200 one of them ran up to 35% slower than the rest, and one
#: took 395 ms of CPU optimizer where its neighbours took 211.
PLAN_AFTER = 4


class Phase(enum.Enum):
    """Where a host-optimizer step stands."""

    #: the first step: the device bytes it holds are measured, too small a budget refused
    PROBE = "probe"
    #: steps 2 to ``PLAN_AFTER``: their times are measured for the GPU's share
    MEASURE = "measure"
    #: every later step: the share planned from them in force
    STEADY = "steady"

    @classmethod
    def of(cls, step: int) -> Phase:
        """The phase of the ``step``-th step (1-based)."""
        if step == 1:
            return cls.PROBE
        return cls.MEASURE if step <= PLAN_AFTER else cls.STEADY
