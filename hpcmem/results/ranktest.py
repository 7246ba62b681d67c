"""The Mann-Whitney U rank test: do two sets of samples come from the same distribution?

Used by the check to tell a real change from noise, as asv and conbench do: it looks only
at the order of the samples, so one repeat stalled for milliseconds by a busy neighbour
weighs no more than any other slow repeat. Two-sided; exact (all orderings counted) for
small samples without ties, the normal approximation with tie and continuity correction
otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

__all__ = ["EXACT_LIMIT", "mann_whitney_p", "smallest_p"]

#: up to this many pairs (len(x) * len(y)) without ties, the p-value is exact
EXACT_LIMIT = 400


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks of ``values`` (ties get their average rank) and the sizes of tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for index in order[start:end + 1]:
            ranks[index] = (start + end) / 2 + 1
        ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of ``m`` and ``n`` distinct samples give each U from 0 to m*n."""
    if m == 0 or n == 0:
        return (1,)
    counts = [0] * (m * n + 1)
    for u, ways in enumerate(_u_counts(m - 1, n)):  # the largest sample is an x: above all y
        counts[u + n] += ways
    for u, ways in enumerate(_u_counts(m, n - 1)):  # the largest sample is a y
        counts[u] += ways
    return tuple(counts)


def smallest_p(m: int, n: int) -> float:
    """The smallest two-sided p-value samples of sizes ``m`` and ``n`` can reach: when it
    is above the significance level, the test cannot tell anything apart."""
    if m == 0 or n == 0:
        return 1.0
    return min(1.0, 2 / math.comb(m + n, m))


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float:
    """The two-sided p-value of the Mann-Whitney U test of ``x`` against ``y`` (1.0 when
    either is empty)."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        return 1.0
    ranks, ties = _ranks([*x, *y])
    u = sum(ranks[:m]) - m * (m + 1) / 2
    if m * n <= EXACT_LIMIT and all(t == 1 for t in ties):
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        low = sum(counts[: int(u) + 1]) / total
        high = sum(counts[int(u):]) / total
        return min(1.0, 2 * min(low, high))
    mean = m * n / 2
    tie_term = sum(t**3 - t for t in ties) / ((m + n) * (m + n - 1))
    variance = m * n / 12 * ((m + n + 1) - tie_term)
    if variance <= 0:
        return 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
