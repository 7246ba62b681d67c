"""The base of every error hpcmem raises, so a caller can catch ours, and the bad-input class
every command turns into exit status 2."""

from __future__ import annotations

__all__ = ["MESSAGE_LIMIT", "BadInputError", "HpcmemError", "clip"]

#: the most characters of an offending value (or of a whole message) an error shows
MESSAGE_LIMIT = 300


class HpcmemError(Exception):
    """Base class of every error raised by hpcmem."""


class BadInputError(HpcmemError):
    """Bad input or an unusable path: the command prints one line and exits with status 2."""


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out.

    >>> clip("x" * 400, 10)
    'xxxxxxxxxx… (390 more characters)'
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"
