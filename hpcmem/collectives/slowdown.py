"""A slowdown injected on purpose, for testing the regression check only.

``HPCMEM_TEST_SLOWDOWN=OP:MICROSECONDS`` (for example ``allreduce:2000``) makes every timed
call of that op take that much longer inside the timed region, on every rank: a real,
measured slowdown that ``hpcmem check`` must report as a regression. The rank spins through
it, as a slower call keeps an MPI rank on its CPU (Open MPI's ranks poll): a sleep would
give the rank back its CPU, and beside busy neighbours the scheduler's credit for that
sleep would speed up the run's other ops, a change no real regression makes. Never set it
for a measurement whose figures mean anything; records made with it say so in
``injected_slowdown_us``.
:meth:`TestHooks.from_environment` is the one place the variable is read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpcmem.collectives.ops import OPS
from hpcmem.errors import HpcmemError

__all__ = ["SLOWDOWN_ENV", "Slowdown", "SlowdownError", "TestHooks"]

SLOWDOWN_ENV = "HPCMEM_TEST_SLOWDOWN"


class SlowdownError(HpcmemError, ValueError):
    """``HPCMEM_TEST_SLOWDOWN`` holds something other than ``OP:MICROSECONDS``."""


@dataclass(frozen=True)
class Slowdown:
    """Every timed call of ``op`` followed by ``microseconds`` of spinning."""

    op: str
    microseconds: float


@dataclass(frozen=True)
class TestHooks:
    """What a run does on purpose to test the check; by default nothing."""

    __test__ = False  # not a pytest test class

    slowdown: Slowdown | None = None

    @classmethod
    def from_environment(cls) -> TestHooks:
        """The hooks ``HPCMEM_TEST_SLOWDOWN`` asks for; SlowdownError when it is malformed."""
        text = os.environ.get(SLOWDOWN_ENV, "").strip()
        if not text:
            return cls()
        op, _, micros = text.partition(":")
        try:
            delay = float(micros)
        except ValueError:
            delay = -1.0
        if op not in OPS or not 0 < delay <= 1e6:
            raise SlowdownError(
                f"{SLOWDOWN_ENV}: {text!r} is not OP:MICROSECONDS with OP one of "
                f"{', '.join(OPS)} and 0 < MICROSECONDS <= 1000000 (test use only)")
        return cls(Slowdown(op, delay))

    def slowdown_us(self, op: str) -> float | None:
        """The time added to every timed call of ``op``, or None when it is not slowed."""
        if self.slowdown is None or self.slowdown.op != op:
            return None
        return self.slowdown.microseconds

    def timed(self, op: str, call: Callable[[], Any]) -> Callable[[], Any]:
        """What the timed loop calls for ``call`` of ``op``: ``call`` itself unless slowed."""
        microseconds = self.slowdown_us(op)
        return call if microseconds is None else _slowed(call, microseconds)


def _slowed(call: Callable[[], Any], microseconds: float) -> Callable[[], None]:
    """``call`` followed by ``microseconds`` of spinning, both inside the timed region."""
    seconds = microseconds * 1e-6

    def slow_call() -> None:
        call()
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    return slow_call
