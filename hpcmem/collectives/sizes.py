"""Message sizes: the doubling steps of a sweep and OSU's iteration defaults per size.

Sizes are read by :func:`hpcmem.units.parse_size`.
"""

from __future__ import annotations

__all__ = [
    "LARGE_MESSAGE_SIZE",
    "OSU_ITERATIONS",
    "OSU_ITERATIONS_LARGE",
    "OSU_WARMUP",
    "OSU_WARMUP_LARGE",
    "osu_counts",
    "size_steps",
]

#: OSU's C suite: sizes above this many bytes use the "large" iteration counts
LARGE_MESSAGE_SIZE = 8192
OSU_ITERATIONS = 1000
OSU_WARMUP = 200
OSU_ITERATIONS_LARGE = 100
OSU_WARMUP_LARGE = 10


def size_steps(min_size: int, max_size: int) -> list[int]:
    """Sizes from ``min_size`` doubling up to and including at most ``max_size``, as OSU steps."""
    if min_size <= 0 or max_size < min_size:
        raise ValueError(f"need 0 < min_size <= max_size, got {min_size} and {max_size}")
    sizes = []
    size = min_size
    while size <= max_size:
        sizes.append(size)
        size *= 2
    return sizes


def osu_counts(size: int, iterations: int | None, warmup: int | None) -> tuple[int, int]:
    """``(iterations, warmup)`` for one size: the given values, else OSU's C-suite defaults."""
    large = size > LARGE_MESSAGE_SIZE
    if iterations is None:
        iterations = OSU_ITERATIONS_LARGE if large else OSU_ITERATIONS
    if warmup is None:
        warmup = OSU_WARMUP_LARGE if large else OSU_WARMUP
    return iterations, warmup
