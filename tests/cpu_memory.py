"""A :class:`~hpcmem.um.MemoryScopes` on the CPU, for the trainer integrations' tests.

PyTorch's own allocator on the CPU (:class:`~hpcmem.um.passthrough.PassThroughMemory`) whose
scopes it records (``events``); under a ``gpu_budget`` it attaches the strategy the offload
value names or the plan picks, over the CPU transport, as the managed implementation does
over CUDA, so the integrations train through the real strategies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from hpcmem.um import Offload
from hpcmem.um.budget import CpuTransport
from hpcmem.um.passthrough import PassThroughMemory
from hpcmem.um.policy import Policy, load_policy
from hpcmem.um.strategy import make_strategy


class CpuMemory(PassThroughMemory):
    """Records ``params``, ``inputs``, ``attach``, ``activations`` and ``close``."""

    def __init__(self, gpu_budget: int | None = None) -> None:
        # the hpcmem preset's priorities over PyTorch's allocator; the budget set past the
        # check that a CUDA build without managed memory has none
        super().__init__(Policy("hpcmem", priority=load_policy("hpcmem").priority,
                                allocator="cuda"))
        self.gpu_budget = gpu_budget
        self.device = torch.device("cpu")
        self.events: list[str] = []

    @contextmanager
    def _event(self, name: str) -> Iterator[None]:
        self.events.append(name)
        yield

    def params(self):
        return self._event("params")

    def inputs(self):
        return self._event("inputs")

    @contextmanager
    def activations(self) -> Iterator[None]:
        strategy = self.strategy.scope() if self.strategy else nullcontext()
        with self._event("activations"), strategy:
            yield

    def attach(self, model: Any, optimizer: Any | None = None,
               offload: Offload | None = None, process_group: Any = None) -> None:
        self.events.append("attach")
        if self.gpu_budget is not None:
            self._chunk_loss(model, offload or Offload())
            self._strategy = make_strategy(
                model, optimizer, offload=offload or Offload(), transport=CpuTransport(),
                budget=self.gpu_budget, priority=self.policy.priority,
                device_scope=nullcontext, process_group=process_group,
                batch_split=self._batch_split,
            )

    def stats(self) -> dict[str, Any]:
        """The managed implementation's keys a record reads; nothing escapes on the CPU."""
        stats: dict[str, Any] = {"policy": "hpcmem", "managed": False, "escaped_bytes": 0}
        if self.strategy:
            stats["offload"] = self._offload_stats()
            stats["peak_gpu_resident_bytes"] = stats["offload"]["peak_gpu_resident_bytes"]
        return stats

    def reset_stats(self) -> None:
        if self.strategy:
            self.strategy.reset_stats()

    def _release(self) -> None:
        self.events.append("close")
        if self.strategy:
            self.strategy.close()
