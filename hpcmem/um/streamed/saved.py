"""Tensors autograd saves for backward: kept on the device, offloaded, or named as parameters.

Installed with ``torch.autograd.graph.saved_tensors_hooks``. A saved parameter (or a view
of one) is recorded as that parameter and fetched again when backward needs it, never
copied out. Other saved tensors of at least ``MIN_OFFLOAD_BYTES`` are offloaded to pinned
host memory when the plan says so (the earliest ones of the step: backward needs them
last) and fetched back, a window ahead, in the reverse order of saving; the rest stay on
the device. A storage saved through several views by one operation (q, k and v of one
projection) moves once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.um.budget.host import StepBuffers
from hpcmem.um.budget.transport import Transport
from hpcmem.um.streamed.params import Counters, Entry, ParamStreams

__all__ = ["MIN_OFFLOAD_BYTES", "SavedTensors"]

#: Saved tensors smaller than this stay on the device (not worth a copy each way).
MIN_OFFLOAD_BYTES = 2**20


class _Stored:
    """One storage offloaded to the host in this step."""

    __slots__ = ("device", "host", "nbytes", "order", "refs", "token", "version")

    def __init__(self, order: int, nbytes: int, host: Any, token: Any, version: int) -> None:
        self.order = order  # position among this step's offloaded storages
        self.nbytes = nbytes
        self.host = host
        self.token = token
        self.version = version
        self.refs = 0  # packed views not unpacked yet
        self.device: Any = None  # device copy while fetched


@dataclass(frozen=True)
class _View:
    """How a saved tensor sits in its storage."""

    dtype: Any
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: Any) -> _View:
        return cls(tensor.dtype, tuple(tensor.size()), tuple(tensor.stride()),
                   tensor.storage_offset())

    def on(self, storage_tensor: Any) -> Any:
        import torch

        out = torch.empty(0, dtype=self.dtype, device=storage_tensor.device)
        return out.set_(storage_tensor.untyped_storage(), self.offset, self.size, self.stride)


@dataclass(frozen=True)
class _ParamRef:
    entry: Entry
    view: _View


@dataclass(frozen=True)
class _HostRef:
    stored: _Stored
    view: _View


class SavedTensors:
    """The pack and unpack hooks, and what they measured in the step."""

    def __init__(self, params: ParamStreams, transport: Transport, counters: Counters) -> None:
        self.params = params
        self.transport = transport
        self.counters = counters
        self.buffers = StepBuffers(transport)
        self.window_bytes = 0  # fetched ahead in backward; 0: on demand (the probe step)
        self.offload_below: int | None = None  # candidates before this index go out; None: all
        self.begin_step()

    def begin_step(self) -> None:
        """Forget the last step's storages; start counting candidates again."""
        self.buffers.begin_step()
        self.candidates: list[int] = []  # bytes of each new storage eligible for offload
        self._stored: list[_Stored] = []
        self._by_pointer: dict[int, _Stored] = {}  # storages offloaded by the current operation
        self._next_fetch: int | None = None
        self._ahead = 0

    def new_operation(self) -> None:
        """An operation starts: storages of earlier ones may have been freed and reused."""
        self._by_pointer = {}

    def close(self) -> None:
        """Let go of the host buffers."""
        self.end_step()
        self.buffers.close()

    def end_step(self) -> None:
        """Let go of every device copy fetched in this step."""
        for stored in self._stored:
            self._let_go(stored)
        self._stored = []
        self._by_pointer = {}

    # -- pack ---------------------------------------------------------------------------
    def pack(self, tensor: Any) -> Any:
        # A parameter itself may be saved after its last operation (a custom function's
        # save_for_backward), when its data is the home again.
        entry = self.params.by_param.get(id(tensor))
        if entry is not None:
            whole = _View(tensor.dtype, tuple(tensor.size()), tuple(tensor.stride()), 0)
            return _ParamRef(entry, whole)
        if tensor.device != self.transport.device:
            return tensor
        storage = tensor.untyped_storage()
        entry = self.params.owner(storage.data_ptr())
        if entry is not None:
            return _ParamRef(entry, _View.of(tensor))
        stored = self._same_storage(storage.data_ptr(), tensor)
        if stored is None:
            nbytes = storage.nbytes()
            if nbytes < MIN_OFFLOAD_BYTES:
                return tensor
            index = len(self.candidates)
            self.candidates.append(nbytes)
            if self.offload_below is not None and index >= self.offload_below:
                return tensor
            stored = self._offload(storage, tensor, nbytes)
        stored.refs += 1
        return _HostRef(stored, _View.of(tensor))

    def _same_storage(self, pointer: int, tensor: Any) -> _Stored | None:
        stored = self._by_pointer.get(pointer)
        # Within one operation an address is one storage; unchanged if the version counter
        # (shared by all views) is.
        if stored is None or stored.version != tensor._version:
            return None
        return stored

    def _offload(self, storage: Any, tensor: Any, nbytes: int) -> _Stored:
        import torch

        flat = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
        host = self.buffers.take(nbytes)
        token = self.transport.offload(flat, host)
        self.counters.d2h += nbytes
        stored = _Stored(len(self._stored), nbytes, host, token, tensor._version)
        self._stored.append(stored)
        self._by_pointer[storage.data_ptr()] = stored
        return stored

    # -- unpack -------------------------------------------------------------------------
    def unpack(self, packed: Any) -> Any:
        if isinstance(packed, _ParamRef):
            entry = packed.entry
            position = self.params.access(entry)
            device = self.params.device_copy(entry)
            self.params.after_access(entry, position)
            return packed.view.on(device)
        if isinstance(packed, _HostRef):
            stored = packed.stored
            self._fetch(stored)
            if stored.token is not None:
                self.transport.wait(stored.token)
                stored.token = None
            out = packed.view.on(stored.device)
            stored.refs -= 1
            if stored.refs == 0:
                self._let_go(stored)
            self._prefetch_before(stored.order)
            return out
        return packed

    def _fetch(self, stored: _Stored) -> None:
        if stored.device is None:
            stored.device, stored.token = self.transport.fetch(stored.host, stored.token)
            self.counters.h2d += stored.nbytes
            self._ahead += stored.nbytes

    def _let_go(self, stored: _Stored) -> None:
        if stored.device is not None:
            if stored.token is not None:
                self.transport.wait(stored.token)
                stored.token = None
            self._ahead -= stored.nbytes
            stored.device = None

    def _prefetch_before(self, order: int) -> None:
        """Fetch the storages saved before ``order`` (backward needs them next), a window."""
        start = order - 1 if self._next_fetch is None else min(self._next_fetch, order - 1)
        position = start
        while position >= 0 and self._ahead < self.window_bytes:
            stored = self._stored[position]
            if stored.refs > 0:
                self._fetch(stored)
            position -= 1
        self._next_fetch = position
