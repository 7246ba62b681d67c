"""Narrow copies of streamed fp32 parameters in host memory: what the device fetches.

Under ``Offload(working_dtype="bfloat16")`` a streamed fp32 parameter keeps, beside its fp32
home (the master weights the optimizer steps), a copy rounded to the working dtype. Forward,
the recomputed forward and backward fetch that copy, widened on the device, so each fetch
moves half the bytes of the fp32 home. Under autocast a matmul casts its weights to the
working dtype anyway and computes the same; an op autocast leaves in fp32 (an embedding
lookup) reads the rounded weights, as it does in a bf16 model. The gradient stays fp32.

The optimizer step writes the copy from the updated master, beside the master. A write
into the home by other code (``load_state_dict``, an in-place op on the parameter) shows in
the parameter's version counter: the copy is made again before its next fetch. A write
through ``param.data`` does not, and is not seen. A parameter the plan makes resident is
fetched from its fp32 home and keeps no copy.

The copies take host memory, 2 bytes a parameter in bf16; where the homes and the copies
would pass the host memory available (:func:`~hpcmem.um.budget.host_memory.available_host_bytes`),
none are made and the fetches read the fp32 homes.
"""

from __future__ import annotations

import logging
from typing import Any

from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.transport import Transport

__all__ = ["WorkingCopies", "fetch_source", "widened", "write_working"]

_log = logging.getLogger(__name__)


class WorkingCopies:
    """The working copies of ``working_dtype`` (``Offload.working_dtype``; None, or not
    narrower than a parameter: that parameter keeps none). An entry is a streamed
    parameter's :class:`~hpcmem.um.streamed.params.Entry` (its ``working`` copy and
    ``version``)."""

    def __init__(self, working_dtype: str | None) -> None:
        import torch

        self._torch = torch
        self.dtype = getattr(torch, working_dtype) if working_dtype else None

    @property
    def name(self) -> str | None:
        """The copies' dtype (None: none are kept)."""
        return str(self.dtype).removeprefix("torch.") if self.dtype is not None else None

    def fit(self, entries: list[Any], homes: int, available: int | None) -> int:
        """The copies' host bytes for ``entries``; none where they and the ``homes`` would
        pass the ``available`` host memory (None: not known)."""
        copies = sum(map(self.bytes, entries))
        if copies and available is not None and homes + copies > available:
            _log.warning("gpu_budget: no %s working copies: the homes take %.1f GiB and the "
                         "copies %.1f GiB more, %.1f GiB of host memory are available",
                         self.name, homes / 2**30, copies / 2**30, available / 2**30)
            self.dtype = None
            return 0
        return copies

    def applies(self, entry: Any) -> bool:
        """Whether ``entry`` (streamed) keeps a working copy."""
        param = entry.param
        return self.dtype is not None and param.dtype == self._torch.float32 and (
            self.dtype.itemsize < param.element_size())

    def bytes(self, entry: Any) -> int:
        """Host bytes of ``entry``'s working copy, if it keeps one."""
        return entry.param.numel() * self.dtype.itemsize if self.applies(entry) else 0

    def make(self, entry: Any, arena: HostArena) -> None:
        """``entry``'s copy from its home (written, in host memory), taken from ``arena``."""
        like = self._torch.empty(entry.param.shape, dtype=self.dtype, device="meta")
        entry.working = arena.take(like)
        _copy_home(entry)


def fetch_source(entry: Any, transport: Transport) -> Any:
    """What a fetch of ``entry`` copies: its working copy, made again first if the home was
    written since, or its home."""
    if entry.working is None:
        return entry.home
    if entry.param._version != entry.version:
        if entry.home_ready is not None:
            transport.settle(entry.home_ready)
        _copy_home(entry)
    return entry.working


def _copy_home(entry: Any) -> None:
    """Round ``entry``'s home into its working copy, and note the version it copied."""
    entry.working.copy_(entry.home)
    entry.version = entry.param._version


def widened(entry: Any, device: Any) -> Any:
    """The fetched ``device`` copy as wide as the parameter's home."""
    return device.to(entry.home.dtype)


def write_working(entry: Any, stepped: Any, transport: Transport,
                  rows: slice | None = None) -> Any:
    """The token of writing ``stepped`` (the updated master on the device, or its ``rows``)
    into ``entry``'s working copy; None where it keeps none."""
    if entry.working is None:
        return None
    home = entry.working if rows is None else entry.working[rows]
    return transport.offload(stepped.to(entry.working.dtype), home)
