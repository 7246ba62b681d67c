"""The device end of every copy the host-optimizer mode makes: plain device memory.

On an H200, a copy between page-locked host memory and CUDA managed memory stalled the
compute stream for as long as it ran, though the pages were placed on the GPU and the copy
had a stream of its own (GPT-2-large: 98.9 ms of the compute stream's idle time in one
profiled step, ``benchmarks/results/gpu-20261201-hf-offload-stalls``). Between page-locked
and plain device memory (``cudaMalloc``: PyTorch's own allocator, outside the managed pools)
copies overlap compute. So the working weights, and the two fixed buffers every byte
crosses on its way, are plain device memory, allocated once and counted in the budget:

* :class:`OutRing`: each gradient is copied into a ring of the dtype it leaves in (widened
  to fp32 for PyTorch's CPU kernel, :mod:`.kernel`) on the compute stream, in pieces no
  larger than the ring. The copies out are deferred: gradients of one bucket that follow
  each other in the ring and in the bucket's host buffer go out as one copy when the
  bucket is complete (:meth:`OutRing.flush`), or when the ring needs their place first.
  Each copy out costs the launching thread a stream switch, two events and the copy's
  launch; one per bucket instead of one per gradient keeps that thread launching kernels
  (OPT-350m's profiled step: 81.8 ms of compute idle while it sent 388 gradients one by
  one, ``benchmarks/results/gpu-20261202-families``). Before a region is written again the
  compute stream waits for the copy that last read it (on the GPU: the host never
  blocks), so the gradient itself is free as soon as it is in the ring;
* the upload buffer, where the host uploads fp32 masters into working weights of another
  dtype: they come in through it in pieces, each narrowed into the working weights on the
  copy stream (:meth:`hpcmem.um.host_optimizer.worker.Worker.upload`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hpcmem.um.budget.transport import Transport

__all__ = ["OutRing"]


class _Run:
    """Ring elements ``[start, end)`` bound for ``host[offset : offset + end - start]``."""

    __slots__ = ("end", "host", "offset", "start")

    def __init__(self, start: int, end: int, host: Any, offset: int) -> None:
        self.start, self.end, self.host, self.offset = start, end, host, offset


class OutRing:
    """A ring of ``numel`` elements of ``dtype`` (None: fp32) on ``transport``'s device that
    gradients leave through (see the module docstring)."""

    def __init__(self, transport: Transport, numel: int, dtype: Any = None) -> None:
        import torch

        self.transport = transport
        self.buffer = torch.empty(numel, dtype=dtype or torch.float32,
                                  device=transport.device)
        self._head = 0
        self._reads: deque[tuple[int, int, Any]] = deque()  # (start, end, copy's token)
        self._pending: dict[Any, list[_Run]] = {}  # by key: in the ring, not yet copied out
        self._last: dict[Any, Any] = {}  # by key: the token of its last copy out

    def send(self, tensor: Any, host: Any, offset: int, key: Any) -> None:
        """Copy device ``tensor`` (any floating dtype) into the flat ``host`` buffer (of the
        ring's dtype) from element ``offset`` on, by way of the ring; the copy out waits
        for :meth:`flush` of ``key`` (or for the ring to need the place)."""
        flat = tensor.reshape(-1)
        size = self.buffer.numel()
        for start in range(0, flat.numel(), size):
            piece = flat[start : start + size]
            region_start, region = self._take(piece.numel())
            region.copy_(piece)  # on the compute stream: the gradient is free after it
            runs = self._pending.setdefault(key, [])
            here = offset + start
            last = runs[-1] if runs else None
            if (last is not None and last.end == region_start and last.host is host
                    and last.offset + last.end - last.start == here):
                last.end += piece.numel()
            else:
                runs.append(_Run(region_start, region_start + piece.numel(), host, here))

    def flush(self, key: Any) -> Any:
        """Copy out what ``key`` has in the ring; the token of ``key``'s last copy out (None
        if it sent nothing)."""
        for run in self._pending.pop(key, []):
            self._copy_out(key, run)
        return self._last.get(key)

    def _copy_out(self, key: Any, run: _Run) -> None:
        host = run.host[run.offset : run.offset + run.end - run.start]
        token = self.transport.offload(self.buffer[run.start : run.end], host, hold=False)
        self._reads.append((run.start, run.end, token))
        self._last[key] = token

    def _take(self, numel: int) -> tuple[int, Any]:
        """The next ``numel`` elements of the ring (and where they start), once what they
        held has been copied out."""
        if self._head + numel > self.buffer.numel():
            self._head = 0
        start, end = self._head, self._head + numel
        for key in list(self._pending):  # still to go out from where this piece goes
            runs = self._pending[key]
            for run in [r for r in runs if r.start < end and start < r.end]:
                self._copy_out(key, run)
                runs.remove(run)
            if not runs:
                del self._pending[key]
        newest = None
        for index, (low, high, _) in enumerate(self._reads):
            if low < end and start < high:
                newest = index
        if newest is not None:  # copies finish in order: the newest overlap covers the rest
            self.transport.wait(self._reads[newest][2])
            for _ in range(newest + 1):
                self._reads.popleft()
        self._head = end
        return start, self.buffer[start:end]

    def clear(self) -> None:
        """Every copy is done (the caller flushed every key and synchronized)."""
        if self._pending:
            raise RuntimeError(f"out ring: copies of {sorted(self._pending)} were never flushed")
        self._reads.clear()
        self._last.clear()
