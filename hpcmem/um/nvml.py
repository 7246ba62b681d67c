"""The most GPU memory NVML saw this process hold: the budget as the driver counts it.

PyTorch's counters see only its allocator; NVML's per-process figure also holds the CUDA
context, library workspaces and anything allocated around PyTorch. :class:`NvmlPeak`
samples it on a thread (``pynvml``, from the ``nvidia-ml-py`` package; without it, or
without a device, every figure is None), with the device's used memory beside it, for
where the driver reports no per-process figure.

NVML's per-process figure leaves out CUDA managed memory, even where it is placed on the
GPU. Given ``managed`` (the bytes of this process's managed memory on the GPU now, e.g.
``hpcmem._um.gpu_bytes``), each sample also adds the two: ``held_bytes`` is the most this
process held on the device, all of it, at one instant.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["NvmlPeak", "process_bytes"]

#: Seconds between samples.
INTERVAL_S = 0.005


class NvmlPeak:
    """``with NvmlPeak(index) as peak: ...``; then ``peak.process_bytes``,
    ``peak.device_bytes`` and ``peak.held_bytes`` (None when NVML could not be read)."""

    def __init__(self, index: int = 0, interval_s: float = INTERVAL_S,
                 managed: Callable[[], int] | None = None) -> None:
        self.index = index
        self.interval_s = interval_s
        self.managed = managed
        self.process_bytes: int | None = None
        self.device_bytes: int | None = None
        self.held_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None

    def __enter__(self) -> NvmlPeak:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:  # no library, no driver, no device: nothing to sample
            return self
        self._nvml = pynvml
        self._sample()
        self._thread = threading.Thread(target=self._run, name="hpcmem-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used
        self.device_bytes = max(self.device_bytes or 0, used)
        mine = _own_bytes(self._nvml, self._handle)
        if mine is not None:
            self.process_bytes = max(self.process_bytes or 0, mine)
            held = mine + (self.managed() if self.managed else 0)
            self.held_bytes = max(self.held_bytes or 0, held)

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self._nvml.nvmlShutdown()


def process_bytes(device: Any) -> int | None:
    """The device memory NVML sees this process hold on CUDA ``device`` now (managed memory
    left out), or None where NVML cannot say."""
    try:
        import pynvml
        import torch

        index = torch.cuda._get_nvml_device_index(device)
        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device
        return None
    try:
        return _own_bytes(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()


def _own_bytes(nvml: Any, handle: Any) -> int | None:
    """What NVML's process list on ``handle`` says this process holds (None: not listed, or
    no figure)."""
    for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if process.pid == os.getpid() and isinstance(process.usedGpuMemory, int):
            return process.usedGpuMemory
    return None
