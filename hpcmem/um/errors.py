"""The errors of ``hpcmem.um``; each is an :class:`hpcmem.errors.HpcmemError`.

``PolicyError`` (a bad policy field) lives with the policies and ``OversubscriptionError``
(the guard's refusal, also a ``torch.OutOfMemoryError``) with the guard.
"""

from __future__ import annotations

from hpcmem.errors import HpcmemError

__all__ = ["BudgetError", "UnifiedMemoryError"]


class UnifiedMemoryError(HpcmemError, RuntimeError):
    """Unified Memory cannot run here or now: no CUDA GPU, no native library, a closed
    instance, or another instance open in the process."""


class BudgetError(HpcmemError, ValueError):
    """A GPU budget the job cannot use: not positive, under a policy without Unified Memory,
    or with an optimizer or model the budget strategy does not support."""
