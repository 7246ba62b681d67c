"""The device end of every copy the host-optimizer mode makes: plain device memory.

On an H200, a copy between page-locked host memory and CUDA managed memory stalled the
compute stream for as long as it ran, though the pages were placed on the GPU and the copy
had a stream of its own (GPT-2-large: 98.9 ms of the compute stream's idle time in one
profiled step, ``benchmarks/results/gpu-20261201-hf-offload-stalls``). Between page-locked
and plain device memory (``cudaMalloc``: PyTorch's own allocator, outside the managed pools)
copies overlap compute. So the working weights, and the two fixed buffers every byte
crosses on its way, are plain device memory, allocated once and counted in the budget:

* :class:`OutRing`: each gradient is copied into a ring of the dtype it leaves in (widened
  to fp32 for PyTorch's CPU kernel, :mod:`.kernel`) on the compute stream and copied out
  from there, in pieces no larger than the ring; before a region is written
  again the compute stream waits for the copy that last read it (on the GPU: the host
  never blocks), so the gradient itself is free as soon as it is widened;
* the upload buffer, where the host uploads fp32 masters into working weights of another
  dtype: they come in through it in pieces, each narrowed into the working weights on the
  copy stream (:meth:`hpcmem.um.host_optimizer.worker.Worker.upload`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hpcmem.um.stream.transport import Transport

__all__ = ["OutRing"]


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

    def send(self, tensor: Any, host: Any) -> Any:
        """Copy device ``tensor`` (any floating dtype) into ``host`` (as many elements, of
        the ring's dtype); the token of the last piece's copy."""
        flat, out = tensor.reshape(-1), host.reshape(-1)
        size = self.buffer.numel()
        token = None
        for start in range(0, flat.numel(), size):
            piece = flat[start : start + size]
            region = self._take(piece.numel())
            region.copy_(piece)  # on the compute stream: the gradient is free after it
            token = self.transport.offload(region, out[start : start + piece.numel()],
                                           hold=False)
            self._reads.append((self._head - piece.numel(), self._head, token))
        return token

    def _take(self, numel: int) -> Any:
        """The next ``numel`` elements of the ring, once no copy still reads them."""
        if self._head + numel > self.buffer.numel():
            self._head = 0
        start, end = self._head, self._head + numel
        newest = None
        for index, (low, high, _) in enumerate(self._reads):
            if low < end and start < high:
                newest = index
        if newest is not None:  # copies finish in order: the newest overlap covers the rest
            self.transport.wait(self._reads[newest][2])
            for _ in range(newest + 1):
                self._reads.popleft()
        self._head = end
        return self.buffer[start:end]

    def clear(self) -> None:
        """Every copy is done (the caller synchronized)."""
        self._reads.clear()
