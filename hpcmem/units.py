"""Sizes and counts as people write them: bytes in binary units, counts in decimal units.

A size is bytes: ``8``, ``4K``, ``1MiB``, ``1.5G``, ``2T`` (K = 1024; a trailing ``B`` or
``iB`` is allowed). A count is a number of things, parameters for example: ``125M``,
``1.3B``, ``6B`` (K = 1000, B and G = 10^9). Both are whole numbers once the unit is applied,
at most :data:`LARGEST` (what a signed 64-bit integer holds: no size beyond it can be
allocated or passed to C).

>>> parse_size("4K"), parse_size("1.5MiB"), parse_count("1.3B")
(4096, 1572864, 1300000000)
>>> format_size(3 << 20), format_count(125_000_000)
('3 MiB', '125M')
"""

from __future__ import annotations

import re

from hpcmem.errors import HpcmemError, clip

__all__ = [
    "BINARY_UNITS",
    "DECIMAL_UNITS",
    "LARGEST",
    "UnitError",
    "format_count",
    "format_size",
    "parse_count",
    "parse_size",
]

#: size units: powers of 1024
BINARY_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: count units: powers of 1000 (B for billion, as model sizes are written)
DECIMAL_UNITS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
#: the largest size or count: a signed 64-bit integer's largest value (8 EiB - 1 byte)
LARGEST = (1 << 63) - 1
SIZE_FORMS = "a number with optional K, M, G or T (binary units), e.g. 8, 4K, 1M, 1.5G"
COUNT_FORMS = "a number with optional K, M, B or T, e.g. 125M, 1.3B, 6B"

# ASCII digits only (int() also takes '٣'), and few enough that int() takes them all
_NUMBER = r"([0-9]{1,30}(?:\.[0-9]{1,30})?)"
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_COUNT = re.compile(rf"^\s*{_NUMBER}\s*([KMBGT]?)\s*$", re.IGNORECASE)


class UnitError(HpcmemError, ValueError):
    """A size or count that cannot be read; the message names the text and the accepted forms."""


def _whole(text: str | int, pattern: re.Pattern[str], units: dict[str, int]) -> int | None:
    """``text`` as a whole number with its unit applied, or None when it is not one."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = pattern.match(str(text))
    if not match:
        return None
    number, unit = match.group(1), units[match.group(2).upper()]
    whole, _, fraction = number.partition(".")
    scaled = int(whole) * unit + int(fraction or 0) * unit // 10 ** len(fraction)
    exact = int(fraction or 0) * unit % 10 ** len(fraction) == 0
    return scaled if exact else None


def _at_most_largest(text: str | int, value: int, what: str) -> int:
    """``value``, or UnitError when it is above :data:`LARGEST`."""
    if value > LARGEST:
        raise UnitError(f"{clip(repr(text))} is more than 2^63 - 1, the largest {what} "
                        "(a signed 64-bit integer)")
    return value


def parse_size(text: str | int, *, positive: bool = False) -> int:
    """Bytes in ``text`` (``8``, ``4K``, ``1MiB``, ``1.5G``), at most :data:`LARGEST`;
    raises :class:`UnitError`."""
    value = _whole(text, _SIZE, BINARY_UNITS)
    if value is None or value < 0:
        raise UnitError(f"{clip(repr(text))} is not a size (accepted: {SIZE_FORMS})")
    if positive and value == 0:
        raise UnitError(f"{clip(repr(text))} is not a positive size (accepted: {SIZE_FORMS})")
    return _at_most_largest(text, value, "size")


def parse_count(text: str | int) -> int:
    """A positive count in ``text`` (``125M``, ``1.3B``, ``6B``), at most :data:`LARGEST`;
    raises :class:`UnitError`."""
    value = _whole(text, _COUNT, DECIMAL_UNITS)
    if value is None or value < 1:
        raise UnitError(f"{clip(repr(text))} is not a positive count (accepted: {COUNT_FORMS})")
    return _at_most_largest(text, value, "count")


def format_size(size: float) -> str:
    """Bytes as ``8 B``, ``4 KiB``, ``1.5 MiB``, ``40 GiB``."""
    for unit in ("T", "G", "M", "K"):
        if size >= BINARY_UNITS[unit]:
            return f"{size / BINARY_UNITS[unit]:g} {unit}iB"
    return f"{size:g} B"


def format_count(count: float) -> str:
    """A count in three significant digits: ``125M``, ``1.3B``, ``25.6M``, ``512``."""
    for unit in ("T", "B", "M", "K"):
        if count >= DECIMAL_UNITS[unit]:
            return f"{count / DECIMAL_UNITS[unit]:.3g}{unit}"
    return f"{count:g}"
