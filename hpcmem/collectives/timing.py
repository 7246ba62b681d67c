"""The OSU C-suite timing loop and its statistics across ranks.

Each iteration is timed on its own with ``MPI.Wtime`` around the one call, and a
barrier separates iterations outside the timed region. A rank's latency is its
mean over the timed iterations; the reported average is the mean of the ranks'
latencies and min/max are the smallest and largest rank latency, as OSU does.
The timed region holds only two clock reads and one prebound call
(``functools.partial`` over the mpi4py method): no Python work per iteration
beyond the loop itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Latency", "across_ranks", "median_latency", "rank_latency"]


@dataclass(frozen=True)
class Latency:
    """Latency of one point in microseconds, across ranks."""

    avg: float
    min: float
    max: float

    def to_record(self) -> dict[str, float]:
        """The ``latency_us`` field of a record."""
        return {"avg": self.avg, "min": self.min, "max": self.max}


def rank_latency(
    comm: Any, call: Callable[[], Any], iterations: int, warmup: int, *, separate: bool = True
) -> float:
    """This rank's mean seconds per ``call`` over ``iterations`` after ``warmup`` untimed ones.

    ``separate`` puts a barrier after every iteration, outside the timed region
    (OSU's collective loop); the barrier benchmark itself runs without it.
    """
    from mpi4py import MPI

    wtime = MPI.Wtime
    barrier = comm.Barrier if separate else _nothing
    comm.Barrier()
    for _ in range(warmup):
        call()
        barrier()
    total = 0.0
    for _ in range(iterations):
        start = wtime()
        call()
        total += wtime() - start
        barrier()
    return total / iterations


def _nothing() -> None:
    return None


def across_ranks(comm: Any, seconds: float) -> Latency:
    """Average, minimum and maximum of the ranks' mean latencies, in microseconds, on every rank."""
    from mpi4py import MPI

    micro = seconds * 1e6
    total = comm.allreduce(micro, op=MPI.SUM)
    return Latency(
        avg=total / comm.Get_size(),
        min=comm.allreduce(micro, op=MPI.MIN),
        max=comm.allreduce(micro, op=MPI.MAX),
    )


def median_latency(repeats: Sequence[Latency]) -> Latency:
    """Per field, the median over independent repeats of the timed loop."""
    return Latency(
        avg=statistics.median(r.avg for r in repeats),
        min=statistics.median(r.min for r in repeats),
        max=statistics.median(r.max for r in repeats),
    )
