"""Data parallelism under a GPU budget: the ranks of a process group and their shards.

ZeRO-2's layout: every rank holds the whole model's working weights; the gradients of each
bucket are averaged over the ranks by a reduce-scatter, so each rank keeps and steps
``1 / size`` of the fp32 masters and optimizer state; the updated shards are all-gathered
into every rank's working weights. :class:`Ranks` is the arithmetic of that layout (a
bucket padded so that it splits into ``size`` equal, aligned shards) and the collectives
it needs, the same calls on gloo (CPU tensors) and NCCL (GPU tensors).
:func:`data_parallel` finds the group a job trains over (None: one rank).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hpcmem.um.errors import BudgetError

__all__ = ["Ranks", "data_parallel"]

#: The backend each device type's collectives need.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True)
class Ranks:
    """This process's place in ``group`` (``rank`` of ``size``), collectives on ``device``."""

    group: Any
    rank: int
    size: int
    device: Any

    def padded(self, numel: int, align: int) -> int:
        """``numel`` rounded up to ``size`` shards of a multiple of ``align`` elements."""
        unit = self.size * align
        return -(-numel // unit) * unit

    def shard(self, numel: int) -> tuple[int, int]:
        """This rank's elements ``[start, end)`` of a padded buffer of ``numel``."""
        if numel % self.size:
            raise ValueError(f"shard: {numel} elements do not split into {self.size} ranks")
        size = numel // self.size
        return self.rank * size, (self.rank + 1) * size

    def reduce_scatter(self, shard: Any, full: Any) -> Any:
        """Start averaging ``full`` over the ranks into this rank's ``shard`` of it; the
        work to wait for."""
        import torch.distributed as dist

        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return scatter(shard, full, op=dist.ReduceOp.AVG, group=self.group, async_op=True)

    def all_gather(self, full: Any) -> Any:
        """Start gathering every rank's shard of ``full`` into it (this rank's in place);
        the work to wait for."""
        start, end = self.shard(full.numel())
        return _gather()(full, full[start:end], group=self.group, async_op=True)

    def gathered(self, shard: Any) -> Any:
        """The whole buffer of which ``shard`` is this rank's part (set-up and close)."""
        import torch

        full = torch.empty(shard.numel() * self.size, dtype=shard.dtype, device=self.device)
        start, end = self.shard(full.numel())
        full[start:end].copy_(shard)
        self.all_gather(full).wait()
        return full if shard.device == full.device else full.to(shard.device)

    def total(self, value: float) -> float:
        """``value`` summed over the ranks (a gradient norm's square)."""
        import torch
        import torch.distributed as dist

        summed = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed, group=self.group)
        return float(summed.item())

    def broadcast(self, tensors: Iterable[Any]) -> None:
        """Rank 0's values into ``tensors`` on every rank (as DDP starts)."""
        import torch.distributed as dist

        for tensor in tensors:
            dist.broadcast(tensor, dist.get_global_rank(self.group, 0), group=self.group)

    def check_same(self, values: dict[str, int]) -> None:
        """Refuse a layout that differs between ranks, naming the first field that does
        and both values (one all-gather of the numbers)."""
        import torch

        mine = torch.tensor(list(values.values()), dtype=torch.int64, device=self.device)
        every = torch.empty(self.size * mine.numel(), dtype=torch.int64, device=self.device)
        _gather()(every, mine, group=self.group)
        table = every.view(self.size, -1).tolist()
        for column, name in enumerate(values):
            for rank, row in enumerate(table):
                if row[column] != table[0][column]:
                    raise BudgetError(
                        f"data parallel {name}: rank {rank} has {row[column]}, rank 0 has "
                        f"{table[0][column]}; every rank needs the same")


def _gather() -> Any:
    """``torch.distributed``'s all-gather into one tensor (renamed in PyTorch 2.13)."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def data_parallel(process_group: Any, device: Any) -> Ranks | None:
    """The ranks a job on ``device`` trains over: those of ``process_group``, even one (its
    collectives then run, as on several); with None, those of the default group when
    ``torch.distributed`` is initialised with several, else None (one rank, no collective).
    A group whose backend cannot reduce tensors on ``device`` is refused."""
    import torch.distributed as dist

    if process_group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if dist.get_world_size() == 1:
            return None
        process_group = dist.group.WORLD
    size = dist.get_world_size(process_group)
    wanted = BACKENDS.get(device.type)
    backend = str(dist.get_backend(process_group))
    if wanted is None or wanted not in backend:
        raise BudgetError(f"process_group backend: {backend!r} cannot reduce {device.type} "
                          f"tensors; accepted: {wanted or ', '.join(BACKENDS.values())}")
    return Ranks(process_group, dist.get_rank(process_group), size, device)
