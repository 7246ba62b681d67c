"""How bytes move between host and device under a GPU budget, for every strategy.

:class:`CudaTransport` copies between pinned host memory and the GPU on two copy streams (one
each way, so both directions overlap each other and compute), with events for ordering;
:class:`~hpcmem.um.budget.cpu_transport.CpuTransport` does the same copies synchronously on
the CPU, so the strategies' logic runs, and is tested, on a machine without a GPU.

Ordering rules (CUDA): a device tensor made for a fetch is allocated on the compute stream
and written on the host-to-device stream after that stream waited for the compute work
queued so far (the block may have been freed by it); compute waits for the fetch's event
before the first use. An offload waits for the compute work that produced the tensor, and
the transport holds the tensor until its copy is done, so its block is not reused early.
The bytes so held are capped (:class:`InFlight`, ``out_cap``): before a copy that would pass
the cap is issued, the host waits for the oldest copies to finish, so tensors waiting for
the device-to-host stream never pile up on the GPU while the host runs ahead of it.
(Not ``record_stream``: while allocations are routed to a pool, PyTorch defers the release
of blocks used on other streams until no pool is routed, which in a training loop is never.)
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any

from hpcmem.um.nvml import process_bytes
from hpcmem.um.tensors import host_view, tensor_bytes

__all__ = ["BANDWIDTH_PROBE_BYTES", "DEFAULT_OUT_CAP", "CudaTransport", "InFlight", "Transport",
           "pcie_transfer_ms"]

#: Bytes copied each way when the pinned-copy bandwidth is measured.
BANDWIDTH_PROBE_BYTES = 256 * 2**20
#: Device bytes waiting for the device-to-host stream at most, until a plan sets the cap.
DEFAULT_OUT_CAP = 256 * 2**20


class InFlight:
    """Device tensors held until their copy is done, at most ``cap`` bytes together.

    A token is anything with ``query()`` (done yet?) and ``synchronize()`` (block the host
    until done): a CUDA event. Copies finish in the order they were issued (one stream).
    One copy larger than the cap is let through alone.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.bytes = 0
        self._queue: deque[tuple[Any, Any, int]] = deque()  # (token, tensor, bytes)

    def collect(self) -> None:
        """Let go of tensors whose copy is done."""
        while self._queue and self._queue[0][0].query():
            self._pop()

    def make_room(self, nbytes: int) -> None:
        """Wait (on the host) for the oldest copies until ``nbytes`` more fit under the cap."""
        self.collect()
        while self._queue and self.bytes + nbytes > self.cap:
            self._queue[0][0].synchronize()
            self._pop()

    def add(self, token: Any, tensor: Any, nbytes: int) -> None:
        """Hold ``tensor`` until ``token`` is done."""
        self._queue.append((token, tensor, nbytes))
        self.bytes += nbytes

    def clear(self) -> None:
        """Every copy is done (the caller synchronized)."""
        self._queue.clear()
        self.bytes = 0

    def _pop(self) -> None:
        self.bytes -= self._queue.popleft()[2]


class Transport(ABC):
    """Copies between host homes and device tensors, and the device's memory figures."""

    device: Any
    #: Device bytes being copied out at most (see :class:`InFlight`).
    out_cap: int = DEFAULT_OUT_CAP
    #: Whether copies are timed (:meth:`busy_ms`).
    timing: bool = False

    @abstractmethod
    def fetch(self, host: Any, after: Any = None) -> tuple[Any, Any]:
        """A device copy of ``host`` and the token to wait for before using it; the copy
        starts after ``after`` (the token of the last write into ``host``)."""

    @abstractmethod
    def offload(self, device_tensor: Any, host: Any, hold: bool = True) -> Any:
        """Copy ``device_tensor`` into ``host``; the token of that write. ``hold``: keep the
        tensor alive until the copy is done, within ``out_cap`` (False: the caller owns its
        memory and orders its reuse after the token)."""

    @abstractmethod
    def upload(self, host: Any, device_tensor: Any, after: Any = None, through: Any = None
               ) -> Any:
        """Copy ``host`` into the existing ``device_tensor`` once ``after`` (a token of
        :meth:`mark`) is done, by way of ``through`` (a device tensor of ``host``'s dtype,
        then cast into ``device_tensor`` on the device) if given; the token of that write.
        Callable from any thread."""

    @abstractmethod
    def wait(self, token: Any) -> None:
        """Make the compute stream wait for ``token``."""

    @abstractmethod
    def mark(self) -> Any:
        """A token for the compute work queued so far (timed: see :meth:`elapsed_ms`)."""

    @abstractmethod
    def settle(self, token: Any) -> None:
        """Block the calling thread until ``token`` is done."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two tokens of :meth:`mark` (both done)."""

    @abstractmethod
    def busy_ms(self) -> dict[str, float]:
        """Milliseconds spent copying each way (``h2d``, ``d2h``; ``cast``: narrowing an
        upload on the device) since the last call, for the copies made while ``timing`` was
        on."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until every copy issued so far is done."""

    @abstractmethod
    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A host tensor to offload into (pinned where the device has DMA)."""

    @abstractmethod
    def pin(self, host: Any) -> None:
        """Make a host tensor's memory a DMA target (page-locked) until :meth:`unpin`."""

    @abstractmethod
    def unpin(self, host: Any) -> None:
        """Undo :meth:`pin`."""

    @abstractmethod
    def to_host(self, tensor: Any, host: Any) -> None:
        """Copy a tensor (anywhere) into ``host`` and wait for it (set-up, not the hot path)."""

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak of device bytes."""

    @abstractmethod
    def live_bytes(self) -> int:
        """Device bytes allocated now."""

    @abstractmethod
    def peak_bytes(self) -> int:
        """Most device bytes allocated at once since :meth:`reset_peak`."""

    @abstractmethod
    def resident_peak_bytes(self) -> int:
        """Most device memory held at once since :meth:`reset_peak`, allocator caches included."""

    @abstractmethod
    def outside_bytes(self) -> int:
        """Device memory this process holds now outside what :meth:`resident_peak_bytes`
        counts: the CUDA context, library workspaces, plain (not managed) allocations."""

    @abstractmethod
    def bandwidth(self, probe_bytes: int) -> dict[str, float]:
        """Measured copy bandwidth, bytes/s: ``h2d``, ``d2h`` and ``both`` (each way at once)."""


class CudaTransport(Transport):
    """Pinned host memory <-> GPU on two copy streams (``cudaMemcpyAsync``).

    With ``native`` (``hpcmem._um``), managed tensors are read where they are placed and the
    resident peak is the peak of managed segments placed on the GPU (less ``leftover_gpu``,
    what earlier jobs left there); without it, PyTorch's peak reserved bytes.
    """

    def __init__(self, device: Any, native: Any = None, leftover_gpu: int = 0) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self._h2d = torch.cuda.Stream(self.device)
        self._d2h = torch.cuda.Stream(self.device)
        self._native = native
        self._leftover_gpu = leftover_gpu
        self._copying = InFlight(DEFAULT_OUT_CAP)
        self._timed: dict[str, list[tuple[Any, Any]]] = {"h2d": [], "d2h": [], "cast": []}

    @property
    def out_cap(self) -> int:  # type: ignore[override]
        return self._copying.cap

    @out_cap.setter
    def out_cap(self, nbytes: int) -> None:
        self._copying.cap = nbytes

    def _compute(self) -> Any:
        return self._torch.cuda.current_stream(self.device)

    def _copy(self, way: str, stream: Any, dst: Any, src: Any) -> Any:
        """``dst.copy_(src)`` on ``stream`` (after what it waits for); the event after it."""
        torch = self._torch
        start = torch.cuda.Event(enable_timing=True) if self.timing else None
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            if start is not None:
                start.record(stream)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event(enable_timing=self.timing)
            done.record(stream)
        if start is not None:
            self._timed[way].append((start, done))
        return done

    def fetch(self, host: Any, after: Any = None) -> tuple[Any, Any]:
        torch = self._torch
        self._copying.collect()
        out = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        self._h2d.wait_stream(self._compute())
        if after is not None:
            self._h2d.wait_event(after)
        return out, self._copy("h2d", self._h2d, out, host)

    def upload(self, host: Any, device_tensor: Any, after: Any = None, through: Any = None
               ) -> Any:
        if after is not None:
            self._h2d.wait_event(after)
        if through is None:
            return self._copy("h2d", self._h2d, device_tensor, host)
        self._copy("h2d", self._h2d, through, host)
        return self._copy("cast", self._h2d, device_tensor, through)

    def offload(self, device_tensor: Any, host: Any, hold: bool = True) -> Any:
        nbytes = tensor_bytes(device_tensor)
        hold = hold and device_tensor.is_cuda
        if hold:
            self._copying.make_room(nbytes)
        self._d2h.wait_stream(self._compute())
        done = self._copy("d2h", self._d2h, host, device_tensor)
        if hold:
            self._copying.add(done, device_tensor, nbytes)
        return done

    def wait(self, token: Any) -> None:
        self._compute().wait_event(token)

    def mark(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._compute())
        return event

    def settle(self, token: Any) -> None:
        token.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end)

    def busy_ms(self) -> dict[str, float]:
        busy = {}
        for way, pairs in self._timed.items():
            busy[way] = sum(start.elapsed_time(done) for start, done in pairs if done.query())
            self._timed[way] = [(s, d) for s, d in pairs if not d.query()]
        return busy

    def synchronize(self) -> None:
        self._h2d.synchronize()
        self._d2h.synchronize()
        self._copying.clear()

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._torch.empty(shape, dtype=dtype, pin_memory=True)

    def pin(self, host: Any) -> None:
        cudart = self._torch.cuda.cudart()
        nbytes = tensor_bytes(host)
        status = int(cudart.cudaHostRegister(host.data_ptr(), nbytes, 0))
        if status != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: CUDA error {status}")

    def unpin(self, host: Any) -> None:
        self._torch.cuda.cudart().cudaHostUnregister(host.data_ptr())

    def to_host(self, tensor: Any, host: Any) -> None:
        torch = self._torch
        managed = self._native is not None and tensor.is_cuda and tensor.is_contiguous()
        if managed and self._native.is_managed(tensor.data_ptr()):
            # Managed pages placed on the host: the CPU reads them where they are.
            torch.cuda.synchronize(self.device)
            host.copy_(host_view(tensor))
            return
        host.copy_(tensor)
        torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self.device)
        if self._native is not None:
            self._native.reset_gpu_peak()

    def live_bytes(self) -> int:
        return self._torch.cuda.memory_allocated(self.device)

    def peak_bytes(self) -> int:
        return self._torch.cuda.max_memory_allocated(self.device)

    def resident_peak_bytes(self) -> int:
        if self._native is None:
            return self._torch.cuda.max_memory_reserved(self.device)
        return max(0, self._native.gpu_peak_bytes() - self._leftover_gpu)

    def outside_bytes(self) -> int:
        held = process_bytes(self.device)  # NVML: all but managed memory; None: unknown
        reserved = self._torch.cuda.memory_reserved(self.device)
        if self._native is None:  # the resident peak is PyTorch's reserved bytes
            return 0 if held is None else max(0, held - reserved)
        return held if held is not None else max(0, reserved - self._native.managed_bytes())

    def bandwidth(self, probe_bytes: int) -> dict[str, float]:
        torch = self._torch
        nbytes = max(2**20, min(probe_bytes, BANDWIDTH_PROBE_BYTES))
        host_in = self.host_empty((nbytes,), torch.uint8)
        host_out = self.host_empty((nbytes,), torch.uint8)
        device = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        device_in = torch.empty_like(device)

        def best(copies: list[tuple[Any, Any, Any]]) -> float:
            times = []
            for _ in range(3):
                torch.cuda.synchronize(self.device)
                start = time.perf_counter()
                for stream, dst, src in copies:
                    with torch.cuda.stream(stream):
                        dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(self.device)
                times.append(time.perf_counter() - start)
            return nbytes / min(times)

        result = {
            "h2d": best([(self._h2d, device, host_in)]),
            "d2h": best([(self._d2h, host_out, device)]),
            "both": best([(self._h2d, device, host_in), (self._d2h, host_out, device_in)]),
        }
        del host_in, host_out, device, device_in
        return result


def pcie_transfer_ms(h2d: float, d2h: float, bandwidth: dict[str, float]) -> float:
    """The least time to move ``h2d`` and ``d2h`` bytes at the measured pinned-copy rates
    (bytes/s: ``h2d`` and ``d2h`` one way, ``both`` each way when both run at once)."""
    both = min(h2d, d2h)
    alone = (h2d - both) / bandwidth["h2d"] + (d2h - both) / bandwidth["d2h"]
    return (both / bandwidth["both"] + alone) * 1e3
