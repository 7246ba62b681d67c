"""``MemoryScopes``: the scopes a training loop puts its memory in, behind one interface.

:func:`hpcmem.um.UnifiedMemory` makes the implementation a policy asks for: a
:class:`~hpcmem.um.passthrough.PassThroughMemory` for the ``cuda`` preset (PyTorch's own
allocator, every scope a no-op) or a :class:`~hpcmem.um.managed.ManagedMemory` for the Unified
Memory presets (one managed pool per type of training data, advice, prefetch, the guard and
the GPU budget). Both subclass this interface, which imports neither. A loop written once runs
under either::

    with UnifiedMemory("hpcmem", device=0) as um:
        with um.params():
            model = build().to("cuda")
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        um.attach(model, optimizer)          # grads, optimizer state, budget strategy
        for batch in batches:
            x = um.stage(batch)               # the batch on the device
            with um.activations():            # forward + backward, all threads
                loss = model(x).sum()
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(um.stats())
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.um.errors import BudgetError
from hpcmem.um.guard import oversubscription_allowed
from hpcmem.um.policy import Policy, load_policy
from hpcmem.units import SIZE_FORMS, UnitError, parse_size

if TYPE_CHECKING:
    from hpcmem.um.budget.causal_lm import ChunkedLoss
    from hpcmem.um.budget.offload import Offload
    from hpcmem.um.budget.protocol import BudgetStrategy

__all__ = ["MemoryScopes", "budget_bytes"]


def budget_bytes(value: int | str) -> int:
    """A ``gpu_budget`` as bytes: a positive integer, or a size such as ``"24G"``."""
    if isinstance(value, bool) or not isinstance(value, Integral | str):
        raise BudgetError(f"gpu_budget: {value!r} is not a size (accepted: bytes as an "
                          f"integer, or {SIZE_FORMS})")
    if isinstance(value, Integral) and value <= 0:
        raise BudgetError(f"gpu_budget: {value} bytes must be positive")
    try:
        return parse_size(value if isinstance(value, str) else int(value), positive=True)
    except UnitError as error:
        raise BudgetError(f"gpu_budget: {error}") from None


class MemoryScopes(ABC):
    """Per-type memory scopes for one training job on one GPU; made by
    :func:`hpcmem.um.UnifiedMemory`, whose parameters the constructor takes."""

    def __init__(
        self,
        policy: str | Path | Policy,
        device: int = 0,
        gpu_budget: int | str | None = None,
        allow_oversubscription: bool = False,
        headroom_bytes: int | None = None,
    ) -> None:
        self.policy = load_policy(policy)
        if gpu_budget is not None:
            gpu_budget = budget_bytes(gpu_budget)
        if gpu_budget is not None and not self.policy.managed:
            raise BudgetError(
                f"gpu_budget: needs a managed policy; {self.policy.name!r} is PyTorch's allocator"
            )
        self.gpu_budget = gpu_budget
        self.allow_oversubscription = oversubscription_allowed(allow_oversubscription)
        self.headroom_bytes = headroom_bytes
        self.device_index = device
        self._strategy: BudgetStrategy | None = None
        self._loss: ChunkedLoss | None = None
        self._closed = False

    @property
    def managed(self) -> bool:
        """Whether this job uses Unified Memory (False for the ``cuda`` pass-through)."""
        return self.policy.managed

    # -- scopes -------------------------------------------------------------------------
    @abstractmethod
    def params(self) -> AbstractContextManager[None]:
        """Context: model construction, ``.to(device)``, gradients, optimizer state."""

    @abstractmethod
    def activations(self) -> AbstractContextManager[None]:
        """Context: forward and backward; every allocation of every thread is routed."""

    @abstractmethod
    def inputs(self) -> AbstractContextManager[None]:
        """Context: input batches produced on the CPU."""

    # -- model, optimizer, inputs ---------------------------------------------------------
    @abstractmethod
    def attach(self, model: Any, optimizer: Any | None = None,
               offload: Offload | None = None, process_group: Any = None) -> None:
        """Hook a model and its optimizer into the pools; with a budget, hand them to the
        strategy ``offload``'s type names (:mod:`hpcmem.um.budget.offload`; None or a plain
        ``Offload``: planned), data-parallel over ``process_group``'s ranks (None: the
        default group when ``torch.distributed`` is initialised with several ranks;
        :mod:`hpcmem.um.budget.parallel`)."""

    @property
    def strategy(self) -> BudgetStrategy | None:
        """The budget strategy that took the attached model over (None: no budget, or
        nothing attached yet); ``strategy.replan()`` plans again from the last step."""
        return self._strategy

    def _chunk_loss(self, model: Any, offload: Offload) -> None:
        """Under a budget, the loss of a Hugging Face causal LM in chunks where it applies
        (:class:`~hpcmem.um.budget.causal_lm.ChunkedLoss`); ``close()`` takes it off."""
        from hpcmem.um.budget.causal_lm import ChunkedLoss

        assert self.gpu_budget is not None
        self._loss = ChunkedLoss(model, offload.chunked_loss, self.gpu_budget,
                                 getattr(offload, "batch_split", None))

    @property
    def _batch_split(self) -> Any:
        """The chunked loss's batch split, for the strategy to plan (None: no chunked loss)."""
        return self._loss.split if self._loss is not None and self._loss.applied else None

    def _offload_stats(self) -> dict[str, Any]:
        """The strategy's stats, with the chunked loss's record as ``chunked_loss``."""
        assert self._strategy is not None
        loss = self._loss.record if self._loss is not None else None
        return {**self._strategy.stats(), "chunked_loss": loss}

    @abstractmethod
    def stage(self, batch: Any) -> Any:
        """A CPU tensor's copy on the device, ready for the model."""

    @abstractmethod
    def prefetch(self, tensor: Any, to: str = "gpu") -> None:
        """Prefetch a managed tensor's pages to ``gpu`` or ``cpu`` on the current stream."""

    @abstractmethod
    def segments(self, type_name: str) -> list[tuple[int, int, bool]]:
        """This job's live segments of a type: ``(address, bytes, placed on the GPU)``."""

    # -- guard, budget, statistics ----------------------------------------------------------
    @property
    @abstractmethod
    def limit_bytes(self) -> int | None:
        """The guard's limit on managed bytes (None: oversubscription allowed, or cuda)."""

    @abstractmethod
    def check_request(self, nbytes: int) -> None:
        """Raise the guard's error now if ``nbytes`` more managed memory would pass the limit."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Per-type counters, GPU-resident bytes, the budget strategy's, bytes outside the
        pools."""

    @abstractmethod
    def reset_stats(self) -> None:
        """Peaks to current, counts to zero (e.g. after warm-up)."""

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """End routing and remove hooks. Pools stay alive until their tensors are freed."""
        if not self._closed:
            self._release()
            if self._loss is not None:
                self._loss.close()
            self._closed = True

    @abstractmethod
    def _release(self) -> None:
        """What ``close`` undoes."""

    def __enter__(self) -> MemoryScopes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

