"""CPU and NUMA node lists in libnuma syntax (``0``, ``0-3``, ``0,2``, ``all``).

A list is read as (first, last) ranges and each range is checked against the ids that exist
before any is expanded, so ``0-999999999`` costs what ``0-1`` costs: a refusal naming the
option or variable, the value and the ids there are. The ids returned are at most those that
exist.

>>> parse_id_list("2-3,0", name="--membind", existing=range(4))
(0, 2, 3)
>>> format_id_list([5, 0, 1, 2, 7, 8])
'0-2,5,7-8'
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence

from hpcmem.errors import BadInputError, clip

__all__ = ["ID_LIST_FORMS", "IdListError", "format_id_list", "parse_id_list"]

ID_LIST_FORMS = "N, N-M, comma lists of those (0, 0-3, 0,2), or all"
# ten digits hold every id the kernel can give (a C int); longer numbers are not ids
_RANGE = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")


class IdListError(BadInputError, ValueError):
    """A node or CPU list that is malformed or names an id that does not exist."""


def parse_id_list(
    text: str, *, name: str, existing: Sequence[int], what: str = "node"
) -> tuple[int, ...]:
    """The sorted ids of ``text``, every one of them in ``existing`` (``all``: all of those).

    ``name`` (the option or variable) and ``what`` (``node`` or ``CPU``) go into the
    :class:`IdListError` raised for a malformed list or an id that does not exist. Time and
    memory grow with ``text`` and ``existing``, never with the ranges ``text`` spans.
    """
    have = existing if isinstance(existing, range) else sorted(set(existing))  # a range is sorted
    value = text.strip()
    if value == "all":
        return tuple(have)
    ranges = list(_ranges(value, text, name, what))
    for first, last in ranges:
        missing = _first_missing(first, last, have)
        if missing is not None:
            raise IdListError(
                f"{name}={clip(text)!r}: {what} {missing} does not exist "
                f"({what}s here: {format_id_list(have)})"
            )
    return tuple(
        item
        for first, last in _merged(ranges)
        for item in have[bisect_left(have, first) : bisect_right(have, last)]
    )


def format_id_list(ids: Iterable[int]) -> str:
    """The compact libnuma form of ``ids``: ``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    parts: list[str] = []
    run: list[int] = []
    for n in sorted(set(ids)):
        if run and n != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
            run = []
        run.append(n)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ",".join(parts)


def _ranges(value: str, text: str, name: str, what: str) -> Iterator[tuple[int, int]]:
    """The (first, last) pairs of the comma parts of ``value``; ``text`` is what was given."""
    for part in (p.strip() for p in value.split(",")):
        match = _RANGE.fullmatch(part)
        first, last = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if last < first:
            raise IdListError(
                f"{name}={clip(text)!r}: {clip(part)!r} is not a {what} or a range "
                f"(accepted: {ID_LIST_FORMS})"
            )
        yield first, last


def _first_missing(first: int, last: int, have: Sequence[int]) -> int | None:
    """The smallest id of ``first``-``last`` not in sorted ``have``; None when all are there."""
    start = bisect_left(have, first)
    end = start + (last - first)  # where ``last`` is when no id in between is missing
    if end < len(have) and have[start] == first and have[end] == last:
        return None
    expected = first  # walk to the gap: at most one step per existing id
    for index in range(start, len(have)):
        if have[index] != expected:
            break
        expected += 1
    return expected


def _merged(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """``ranges`` sorted, overlapping and adjacent ones joined, so no id is expanded twice."""
    current: tuple[int, int] | None = None
    for first, last in sorted(ranges):
        if current is not None and first <= current[1] + 1:
            current = (current[0], max(current[1], last))
            continue
        if current is not None:
            yield current
        current = (first, last)
    if current is not None:
        yield current
