"""The oversubscription guard: managed bytes never exceed free device memory minus a headroom.

Asking a shared GPU for more managed memory than it has free can hang the GPU, so the
guard is on unless oversubscription is allowed explicitly (``allow_oversubscription=True``
or ``HPCMEM_ALLOW_OVERSUBSCRIPTION=1``), which belongs on a dedicated node only. The native
allocator enforces the same limit on every segment, before it allocates anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache

__all__ = [
    "ENV_ALLOW",
    "OversubscriptionError",  # noqa: F822 (made on first access, see __getattr__)
    "check_request",
    "default_headroom",
    "managed_limit",
    "oversubscription_allowed",
    "refusal_message",
]

ENV_ALLOW = "HPCMEM_ALLOW_OVERSUBSCRIPTION"
GiB = 2**30


def default_headroom(total_bytes: int) -> int:
    """Bytes kept free for the CUDA context, libraries and other processes: 5%, at least 1 GiB."""
    return max(GiB, total_bytes // 20)


def oversubscription_allowed(flag: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The flag, or ``HPCMEM_ALLOW_OVERSUBSCRIPTION=1`` in the environment."""
    value = (os.environ if environ is None else environ).get(ENV_ALLOW, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV_ALLOW}: {value!r} is not one of 0, 1")
    return flag or value == "1"


def managed_limit(free_bytes: int, headroom_bytes: int, allowed: bool) -> int | None:
    """The most managed bytes the job may hold; None when oversubscription is allowed."""
    if headroom_bytes < 0:
        raise ValueError(f"headroom_bytes: {headroom_bytes} must be >= 0")
    if allowed:
        return None
    return max(0, free_bytes - headroom_bytes)


def refusal_message(request_bytes: int, managed_bytes: int, limit_bytes: int) -> str:
    """Why the guard refused, and how to allow oversubscription where that is safe."""
    return (
        f"hpcmem oversubscription guard: refused {request_bytes} bytes of managed memory: "
        f"{managed_bytes} bytes are already managed and the limit is {limit_bytes} bytes "
        "(free device memory when the job started, minus the headroom). Oversubscribing a "
        "shared GPU can hang it; on a dedicated node allow it with allow_oversubscription=True, "
        f"`hpcmem train --allow-oversubscription` or {ENV_ALLOW}=1, or set a gpu_budget instead."
    )


def check_request(request_bytes: int, managed_bytes: int, limit_bytes: int | None) -> None:
    """Raise :class:`OversubscriptionError` if ``request_bytes`` more would pass the limit."""
    if request_bytes < 0:
        raise ValueError(f"request: {request_bytes} bytes must be >= 0")
    if limit_bytes is not None and managed_bytes + request_bytes > limit_bytes:
        raise _error_class()(refusal_message(request_bytes, managed_bytes, limit_bytes))


@cache
def _error_class() -> type[Exception]:
    import torch

    from hpcmem.errors import HpcmemError

    class OversubscriptionError(torch.OutOfMemoryError, HpcmemError):
        """The guard refused managed memory (a :class:`torch.OutOfMemoryError` too)."""

    OversubscriptionError.__module__ = __name__
    return OversubscriptionError


def __getattr__(name: str):
    # OversubscriptionError subclasses torch.OutOfMemoryError; torch is imported on first use.
    if name == "OversubscriptionError":
        return _error_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
