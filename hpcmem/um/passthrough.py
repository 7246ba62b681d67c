"""The ``cuda`` preset: PyTorch's own caching allocator, every scope a no-op (the ceiling)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.um.errors import BudgetError, UnifiedMemoryError
from hpcmem.um.memory import MemoryScopes
from hpcmem.um.policy import TYPES, Policy

if TYPE_CHECKING:
    from hpcmem.um.budget.offload import Offload

__all__ = ["PassThroughMemory"]


class PassThroughMemory(MemoryScopes):
    """:class:`MemoryScopes` for ``allocator: cuda``: no pools, no advice, no budget."""

    def __init__(self, policy: str | Path | Policy, device: int = 0, **kwargs: Any) -> None:
        super().__init__(policy, device, **kwargs)
        try:
            import torch
        except ImportError as error:
            raise UnifiedMemoryError(
                "the cuda policy needs PyTorch: pip install 'torch>=2.8'"
            ) from error
        self.device = torch.device("cuda", device)

    def _scope(self) -> AbstractContextManager[None]:
        if self._closed:
            raise UnifiedMemoryError("this UnifiedMemory is closed")
        return nullcontext()

    def params(self) -> AbstractContextManager[None]:
        return self._scope()

    def activations(self) -> AbstractContextManager[None]:
        return self._scope()

    def inputs(self) -> AbstractContextManager[None]:
        return self._scope()

    def attach(self, model: Any, optimizer: Any | None = None,
               offload: Offload | None = None, process_group: Any = None) -> None:
        """Nothing to hook: PyTorch's allocator serves every tensor."""
        if offload is not None:
            raise BudgetError("attach: offload needs a gpu_budget, which the cuda policy has not")
        if process_group is not None:
            raise BudgetError("attach: process_group needs a gpu_budget, which the cuda policy "
                              "has not; wrap the model in DistributedDataParallel instead")

    def stage(self, batch: Any) -> Any:
        """Copied host to device (asynchronously when the batch is pinned)."""
        return batch.to(self.device, non_blocking=batch.is_pinned())

    def prefetch(self, tensor: Any, to: str = "gpu") -> None:
        """Nothing to prefetch: no managed memory."""

    def segments(self, type_name: str) -> list[tuple[int, int, bool]]:
        return []

    @property
    def limit_bytes(self) -> int | None:
        return None

    def check_request(self, nbytes: int) -> None:
        """No managed memory, so no guard."""

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "managed": False,
            "escaped_bytes": None,
            **{t: None for t in TYPES},
        }

    def reset_stats(self) -> None:
        """No counters of its own."""

    def _release(self) -> None:
        """Nothing was hooked."""
