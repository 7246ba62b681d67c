"""Recomputing repeated blocks in backward instead of keeping what they save.

A model's repeated blocks (transformer layers, ResNet bottlenecks) are found by structure:
the outermost modules, not containers, that hold parameters and whose class occurs at least
twice. Checkpointing one (``torch.utils.checkpoint``, non-reentrant) keeps only its inputs
through forward and runs its forward again in backward. Buffers the block updates in
forward (BatchNorm's running statistics) are restored after the recomputation, so they
advance once per step, as without it. Each recomputation records how many device bytes it
made (what the block saves for backward when it is not recomputed), and runs inside
``around`` (the streamed strategy releases there what a stopped recomputation left bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["Recompute", "repeated_blocks"]


def repeated_blocks(model: Any) -> list[Any]:
    """The outermost non-container modules with parameters whose class occurs twice or more."""
    from torch import nn

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    counts = Counter(type(module) for module in model.modules())
    found: list[Any] = []

    def visit(module: Any) -> None:
        for child in module.children():
            is_block = (
                counts[type(child)] >= 2
                and not isinstance(child, containers)
                and any(True for _ in child.children())
                and any(True for _ in child.parameters())
            )
            if is_block:
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


class _KeepBuffers(AbstractContextManager[None]):
    """Restores buffers on exit to what they held on entry."""

    def __init__(self, buffers: list[Any]) -> None:
        self._buffers = buffers
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        self._saved = [b.detach().clone() for b in self._buffers]

    def __exit__(self, *exc: object) -> None:
        import torch

        with torch.no_grad():
            for buffer, saved in zip(self._buffers, self._saved, strict=True):
                buffer.copy_(saved)
        self._saved = []


class Recompute:
    """Checkpointing of a set of blocks, switched on as a whole; switched off as a whole or
    for the last blocks where the room holds what they save, and on again for the earliest
    of those where their room is wanted for something else."""

    def __init__(
        self,
        blocks: list[Any],
        live_bytes: Callable[[], int],
        around: Callable[[], AbstractContextManager[None]] = nullcontext,
        names: Mapping[int, str] | None = None,
    ) -> None:
        self.blocks = blocks
        self._names = dict(names or {})  # module ids to names
        self._around = around
        self.enabled = False
        self.saved_bytes: list[int] = []  # per recomputation since the last clear
        self.largest: tuple[Any, int] | None = None  # the block that saved most, and its bytes
        self._live_bytes = live_bytes
        self._wrappers: dict[int, Any] = {}
        self._kept: list[tuple[Any, int]] = []  # blocks given back, the earliest last

    @classmethod
    def of(cls, model: Any, live_bytes: Callable[[], int],
           around: Callable[[], AbstractContextManager[None]] = nullcontext) -> Recompute:
        """Checkpointing of ``model``'s repeated blocks, each known by its module name."""
        blocks = repeated_blocks(model)
        ids = {id(block) for block in blocks}
        return cls(blocks, live_bytes, around,
                   {id(m): name for name, m in model.named_modules() if id(m) in ids})

    def name_of(self, block: Any) -> str:
        """``block``'s module name in its model ('?' where it was not given)."""
        return self._names.get(id(block), "?")

    def enable(self) -> None:
        """Checkpoint every block from the next forward on."""
        if self.enabled:
            return
        for block in self.blocks:
            self._wrap(block)
        self._kept = []
        self.enabled = True

    def _wrap(self, block: Any) -> None:
        wrapper = _checkpointed(block, self._measured(block, block.forward))
        self._wrappers[id(block)] = wrapper
        block.forward = wrapper

    def _measured(self, block: Any, forward: Any) -> Any:
        import torch

        def run(*args: Any, **kwargs: Any) -> Any:
            if torch._C._current_graph_task_id() == -1:  # the first pass, in forward
                return forward(*args, **kwargs)
            before = self._live_bytes()
            try:  # the recomputation stops (raises) once it has what backward needs
                with self._around():
                    return forward(*args, **kwargs)
            finally:
                saved = self._live_bytes() - before
                self.saved_bytes.append(saved)
                if self.largest is None or saved > self.largest[1]:
                    self.largest = (block, saved)

        return run

    def disable(self) -> None:
        """Give every block its own forward back."""
        self._give_back(self.blocks)
        self._wrappers.clear()
        self._kept = []
        self.enabled = False

    @property
    def recomputed(self) -> int:
        """Blocks recomputed from the next forward on."""
        return len(self._wrappers)

    def keep_within(self, room: int, passes: int | None = None) -> int:
        """Give the last blocks their own forward back, as many as what they saved in the
        recomputations since the last clear fits in ``room`` (a block recomputed in several
        parts of a batch saved their sum); ``passes``: only the last ``passes`` backward
        passes count (a batch split's parts, not the rows it measured first); the bytes they
        will keep."""
        count = len(self.blocks)
        saved = self.saved_bytes if passes is None else self.saved_bytes[-passes * count:]
        per_block = [sum(saved[i::count]) for i in range(count)]  # last block first
        kept, total = 0, 0
        for saved in per_block:
            if total + saved > room:
                break
            kept, total = kept + 1, total + saved
        if kept >= count:
            self.disable()
        elif kept:
            self._give_back(self.blocks[-kept:])
        self._kept = [(self.blocks[-1 - i], per_block[i]) for i in range(kept)]
        return total

    @property
    def kept(self) -> int:
        """Blocks :meth:`keep_within` gave their own forward back, still not recomputed."""
        return len(self._kept)

    def take_back(self, need: int, most: int) -> tuple[int, int]:
        """Recompute the earliest kept blocks again from the next forward on, as few as
        free ``need`` bytes of what they save, at most ``most`` of them (none where that
        many do not free it); how many, and the bytes they free."""
        taken, freed = 0, 0
        for _, saved in self._kept[::-1][:max(most, 0)]:  # the earliest kept first
            if freed >= need:
                break
            taken, freed = taken + 1, freed + saved
        if freed < need:
            return 0, 0
        for _ in range(taken):
            self._wrap(self._kept.pop()[0])
        self.enabled = self.enabled or taken > 0
        return taken, freed

    def _give_back(self, blocks: list[Any]) -> None:
        for block in blocks:
            wrapper = self._wrappers.pop(id(block), None)
            if wrapper is not None and block.__dict__.get("forward") is wrapper:
                del block.forward


def _checkpointed(block: Any, forward: Any) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint, noop_context_fn

    buffers = list(block.buffers())

    def contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return nullcontext(), _KeepBuffers(buffers)

    context_fn = contexts if buffers else noop_context_fn

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    return run
