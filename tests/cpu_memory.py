"""A :class:`~hpcmem.um.UnifiedMemory` on the CPU, for the trainer integrations' tests.

Its scopes are no-ops that it records (``events``); under a ``gpu_budget`` it attaches the
strategy the ``Offload`` names or the plan picks, over the CPU transport, as the managed
implementation does over CUDA, so the integrations train through the real strategies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from hpcmem.um.memory import UnifiedMemory
from hpcmem.um.offload import Offload
from hpcmem.um.strategy import make_strategy
from hpcmem.um.stream import CpuTransport


class CpuMemory(UnifiedMemory):
    """Records ``params``, ``inputs``, ``attach``, ``activations`` and ``close``."""

    def __new__(cls, gpu_budget: int | None = None) -> CpuMemory:
        return object.__new__(cls)  # not the policy's implementation: this one

    def __init__(self, gpu_budget: int | None = None) -> None:
        super().__init__("hpcmem", gpu_budget=gpu_budget)
        self.events: list[str] = []
        self.strategy: Any = None

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
        with self._event("activations"), self.strategy.scope() if self.strategy else nullcontext():
            yield

    def attach(self, model: Any, optimizer: Any | None = None, offload: Any = None) -> None:
        self.events.append("attach")
        if self.gpu_budget is not None:
            self.strategy = make_strategy(
                model, optimizer, offload=offload or Offload(), transport=CpuTransport(),
                budget=self.gpu_budget, priority=self.policy.priority,
                device_scope=nullcontext,
            )

    def stage(self, batch: Any) -> Any:
        return batch

    def prefetch(self, tensor: Any, to: str = "gpu") -> None:
        """Nothing to prefetch."""

    def segments(self, type_name: str) -> list[tuple[int, int, bool]]:
        return []

    @property
    def limit_bytes(self) -> int | None:
        return None

    def check_request(self, nbytes: int) -> None:
        """No guard."""

    def rebalance(self) -> dict[str, int]:
        return self.strategy.replan()

    def stats(self) -> dict[str, Any]:
        return {"offload": self.strategy.stats()} if self.strategy else {}

    def reset_stats(self) -> None:
        if self.strategy:
            self.strategy.reset_stats()

    def _release(self) -> None:
        self.events.append("close")
        if self.strategy:
            self.strategy.close()
