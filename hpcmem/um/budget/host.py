"""Page-locked host memory for the homes of streamed tensors (parameters, gradients, state).

Homes live as long as the job, so they are carved out of a few large chunks that are
page-locked once (``cudaHostRegister``: the exact size, where PyTorch's pinned allocator
would round each tensor up to a power of two), each of the arena's memory kind
(:mod:`hpcmem.um.budget.host_memory`). Chunks go back to a process-wide list when the job
closes and are reused by the next job of the same kind, so a repeated job pays no
pinning.
"""

from __future__ import annotations

from typing import Any

from hpcmem.um.budget.host_memory import allocate, placement
from hpcmem.um.budget.transport import Transport
from hpcmem.um.tensors import tensor_bytes

__all__ = ["HostArena", "StepBuffers"]

#: Smallest chunk made when the arena grows after its first reservation.
CHUNK_BYTES = 256 * 2**20
#: Alignment of each home inside a chunk (bytes).
ALIGN = 256

#: Pinned chunks of closed arenas, per transport class and memory kind, for the next job.
_spare: dict[tuple[type, str], list[Any]] = {}


class HostArena:
    """Bump allocation of host homes from pinned chunks of memory ``kind``
    (:data:`~hpcmem.um.budget.host_memory.HOST_MEMORY`)."""

    def __init__(self, transport: Transport, kind: str = "torch") -> None:
        import torch

        self._torch = torch
        self._transport = transport
        self.kind = kind
        self._chunks: list[Any] = []
        self._offset = 0
        self.reserved_bytes = 0

    def reserve(self, nbytes: int) -> None:
        """Make sure ``nbytes`` more can be taken without another chunk."""
        if self._chunks and self._offset + nbytes <= self._chunks[-1].numel():
            return
        self._grow(nbytes)

    def take(self, like: Any) -> Any:
        """A contiguous host tensor with the shape and dtype of ``like`` (contents undefined)."""
        nbytes = tensor_bytes(like)
        self.reserve(nbytes)
        chunk = self._chunks[-1]
        start = self._offset
        self._offset = -(-(start + nbytes) // ALIGN) * ALIGN
        flat = chunk[start : start + nbytes]
        return flat.view(like.dtype).view(like.shape)

    def _grow(self, nbytes: int) -> None:
        spares = _spare.setdefault((type(self._transport), self.kind), [])
        fitting = [c for c in spares if c.numel() >= nbytes and _unreferenced(c)]
        if fitting:
            chunk = min(fitting, key=lambda c: c.numel())
            spares[:] = [c for c in spares if c is not chunk]
        else:
            size = nbytes if not self._chunks else max(nbytes, CHUNK_BYTES)
            chunk = allocate(size, self.kind)
            self._transport.pin(chunk)
        self._chunks.append(chunk)
        self._offset = 0
        self.reserved_bytes += chunk.numel()

    def placement(self) -> dict[str, Any] | None:
        """Where the chunks' pages are (:func:`~hpcmem.um.budget.host_memory.placement`)."""
        return placement(self._chunks, self.kind)

    def close(self) -> None:
        """Offer the chunks to the next job, which takes one only once nothing uses it."""
        self._transport.synchronize()
        _spare.setdefault((type(self._transport), self.kind), []).extend(self._chunks)
        self._chunks = []
        self.reserved_bytes = 0


class StepBuffers:
    """Pinned host buffers for what one step offloads, recycled from step to step.

    A step takes buffers from page-locked chunks by bumping an offset; a chunk is used again
    by a later step once no buffer carved from it is alive (the step's backward has run).
    """

    def __init__(self, transport: Transport) -> None:
        import torch

        self._torch = torch
        self._transport = transport
        self._chunks: list[Any] = []
        self._free: list[Any] = []
        self._current: Any = None
        self._offset = 0

    @property
    def reserved_bytes(self) -> int:
        """Page-locked bytes held."""
        return sum(c.numel() for c in self._chunks)

    def begin_step(self) -> None:
        """Chunks nothing uses any more are free again."""
        self._free = [c for c in self._chunks if _unreferenced(c)]
        self._current = None

    def take(self, nbytes: int) -> Any:
        """A page-locked uint8 host tensor of ``nbytes``."""
        current = self._current
        if current is None or self._offset + nbytes > current.numel():
            fitting = [c for c in self._free if c.numel() >= nbytes]
            if fitting:
                current = fitting[0]
                self._free = [c for c in self._free if c is not current]
            else:
                current = self._torch.empty(max(nbytes, CHUNK_BYTES), dtype=self._torch.uint8)
                self._transport.pin(current)
                self._chunks.append(current)
            self._current, self._offset = current, 0
        start = self._offset
        self._offset = -(-(start + nbytes) // ALIGN) * ALIGN
        return current[start : start + nbytes]

    def close(self) -> None:
        """Unpin every chunk (the buffers of the last step must be dead)."""
        self._transport.synchronize()
        for chunk in self._chunks:
            self._transport.unpin(chunk)
        self._chunks = self._free = []
        self._current = None


def _unreferenced(chunk: Any) -> bool:
    """Whether no home carved from ``chunk`` is alive (a closed job's model may still be)."""
    import torch

    # The chunk tensor and the temporary storage object are the only two references.
    return torch._C._storage_Use_Count(chunk.untyped_storage()._cdata) <= 2
