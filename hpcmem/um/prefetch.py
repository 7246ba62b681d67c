"""``before_use`` prefetch: module hooks that move the next layers' memory to the GPU ahead of use.

Forward pre-hooks (and backward pre-hooks, in reverse order) issue ``cudaMemPrefetchAsync``
for the parameters and gradients of the next module on a side stream and record an event;
the compute stream waits for a module's event before the module runs, so migration overlaps
compute. Ranges in segments the budget placed on the CPU are skipped (read in place).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from hpcmem.um.tensors import tensor_bytes

__all__ = ["PrefetchHooks"]


class PrefetchHooks:
    """Prefetch each leaf module's parameters one module ahead, forward and backward."""

    def __init__(
        self,
        model: Any,
        device: Any,
        segments: Callable[[], list[tuple[int, int, bool]]],
        prefetch: Callable[[int, int, int], None],
        lookahead: int = 1,
    ) -> None:
        """``segments()`` lists the params segments ``(address, bytes, on_gpu)``;
        ``prefetch(address, nbytes, stream_handle)`` moves a range to the GPU."""
        import torch

        self._torch = torch
        self._segments = segments
        self._prefetch = prefetch
        self._device = device
        self._lookahead = lookahead
        self._stream = torch.cuda.Stream(device=device)
        self._modules = [m for m in model.modules() if any(True for _ in m.parameters(False))]
        self._events: dict[int, Any] = {}
        self._gpu_segments: list[tuple[int, int]] | None = None
        self._handles = []
        for index, module in enumerate(self._modules):
            self._handles.append(module.register_forward_pre_hook(self._forward_hook(index)))
            self._handles.append(module.register_full_backward_pre_hook(self._backward_hook(index)))

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_gpu(self, ptr: int) -> bool:
        if self._gpu_segments is None:
            self._gpu_segments = sorted(
                (start, start + size) for start, size, on_gpu in self._segments() if on_gpu
            )
        i = bisect.bisect_right(self._gpu_segments, (ptr, float("inf"))) - 1
        return i >= 0 and self._gpu_segments[i][0] <= ptr < self._gpu_segments[i][1]

    def _issue(self, index: int) -> None:
        if index in self._events or not 0 <= index < len(self._modules):
            return
        current = self._torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        stream_handle = self._stream.cuda_stream
        for param in self._modules[index].parameters(False):
            for tensor in (param, param.grad):
                if tensor is None or not self._on_gpu(tensor.data_ptr()):
                    continue
                self._prefetch(tensor.data_ptr(), tensor_bytes(tensor), stream_handle)
        event = self._torch.cuda.Event()
        event.record(self._stream)
        self._events[index] = event

    def _run(self, index: int, step: int) -> None:
        self._issue(index)
        self._torch.cuda.current_stream(self._device).wait_event(self._events.pop(index))
        for ahead in range(1, self._lookahead + 1):
            self._issue(index + step * ahead)

    def _forward_hook(self, index: int) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            self._run(index, +1)

        return hook

    def _backward_hook(self, index: int) -> Callable[..., None]:
        def hook(module: Any, grad_output: Any) -> None:
            self._run(index, -1)

        return hook
