"""The transport of a machine without a GPU: host and "device" are both the CPU.

Every copy is a synchronous CPU copy, so the streamed and the host-optimizer strategies run,
and are tested, without a GPU.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from hpcmem.um.budget.transport import BANDWIDTH_PROBE_BYTES, Transport
from hpcmem.um.tensors import tensor_bytes

__all__ = ["CpuTransport"]


class CpuTransport(Transport):
    """Host and "device" are both the CPU: every copy is a synchronous CPU copy.

    Runs a budget strategy's bookkeeping without a GPU; device bytes are those of the copies this
    transport made that are still alive.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.device = torch.device("cpu")
        self._live = 0
        self._peak = 0
        self._busy = {"h2d": 0.0, "d2h": 0.0, "cast": 0.0}

    def _timed(self, way: str, dst: Any, src: Any) -> None:
        start = time.perf_counter()
        dst.copy_(src)
        if self.timing:
            self._busy[way] += (time.perf_counter() - start) * 1e3

    def _track(self, tensor: Any) -> Any:
        nbytes = tensor_bytes(tensor)
        self._live += nbytes
        self._peak = max(self._peak, self._live)
        weakref.finalize(tensor, self._untrack, nbytes)
        return tensor

    def _untrack(self, nbytes: int) -> None:
        self._live -= nbytes

    def fetch(self, host: Any, after: Any = None) -> tuple[Any, Any]:
        return self._track(host.clone()), None

    def offload(self, device_tensor: Any, host: Any, hold: bool = True) -> Any:
        self._timed("d2h", host, device_tensor)
        return None

    def upload(self, host: Any, device_tensor: Any, after: Any = None, through: Any = None
               ) -> Any:
        if through is None:
            self._timed("h2d", device_tensor, host)
        else:
            self._timed("h2d", through, host)
            self._timed("cast", device_tensor, through)
        return None

    def wait(self, token: Any) -> None:
        """Copies are synchronous."""

    def mark(self) -> Any:
        return time.perf_counter()

    def settle(self, token: Any) -> None:
        """Copies are synchronous."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (end - start) * 1e3

    def busy_ms(self) -> dict[str, float]:
        busy, self._busy = self._busy, {"h2d": 0.0, "d2h": 0.0, "cast": 0.0}
        return busy

    def synchronize(self) -> None:
        """Copies are synchronous."""

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._torch.empty(shape, dtype=dtype)

    def pin(self, host: Any) -> None:
        """CPU memory needs no pinning here."""

    def unpin(self, host: Any) -> None:
        """Nothing was pinned."""

    def to_host(self, tensor: Any, host: Any) -> None:
        host.copy_(tensor)

    def reset_peak(self) -> None:
        self._peak = self._live

    def live_bytes(self) -> int:
        return self._live

    def peak_bytes(self) -> int:
        return self._peak

    def resident_peak_bytes(self) -> int:
        return self._peak

    def outside_bytes(self) -> int:
        """No context, no allocation outside the copies counted."""
        return 0

    def bandwidth(self, probe_bytes: int) -> dict[str, float]:
        nbytes = max(2**20, min(probe_bytes, BANDWIDTH_PROBE_BYTES))
        source = self._torch.empty(nbytes, dtype=self._torch.uint8)
        start = time.perf_counter()
        source.clone()
        rate = nbytes / max(time.perf_counter() - start, 1e-9)
        return {"h2d": rate, "d2h": rate, "both": rate}
