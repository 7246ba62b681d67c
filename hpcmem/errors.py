"""The base of every error hpcmem raises, so a caller can catch ours."""

from __future__ import annotations

__all__ = ["HpcmemError"]


class HpcmemError(Exception):
    """Base class of every error raised by hpcmem."""
