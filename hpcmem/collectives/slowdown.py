"""A slowdown injected on purpose, for testing the regression check only.

``HPCMEM_TEST_SLOWDOWN=OP:MICROSECONDS`` (for example ``allreduce:2000``) makes every timed
call of that op sleep that long inside the timed region, on every rank: a real, measured
slowdown that ``hpcmem check`` must report as a regression. Never set it for a measurement
whose figures mean anything; records made with it say so in ``injected_slowdown_us``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from hpcmem.collectives.ops import OPS
from hpcmem.errors import HpcmemError

__all__ = ["SLOWDOWN_ENV", "SlowdownError", "injected_slowdown", "slowed"]

SLOWDOWN_ENV = "HPCMEM_TEST_SLOWDOWN"


class SlowdownError(HpcmemError, ValueError):
    """``HPCMEM_TEST_SLOWDOWN`` holds something other than ``OP:MICROSECONDS``."""


def injected_slowdown() -> tuple[str, float] | None:
    """``(op, microseconds)`` from ``HPCMEM_TEST_SLOWDOWN``, or None when it is not set."""
    text = os.environ.get(SLOWDOWN_ENV, "").strip()
    if not text:
        return None
    op, _, micros = text.partition(":")
    try:
        delay = float(micros)
    except ValueError:
        delay = -1.0
    if op not in OPS or not 0 < delay <= 1e6:
        raise SlowdownError(
            f"{SLOWDOWN_ENV}: {text!r} is not OP:MICROSECONDS with OP one of "
            f"{', '.join(OPS)} and 0 < MICROSECONDS <= 1000000 (test use only)")
    return op, delay


def slowed(call: Callable[[], Any], microseconds: float) -> Callable[[], None]:
    """``call`` followed by a sleep of ``microseconds``, both inside the timed region."""
    seconds = microseconds * 1e-6

    def slow_call() -> None:
        call()
        time.sleep(seconds)

    return slow_call
