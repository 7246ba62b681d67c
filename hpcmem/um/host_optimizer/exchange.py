"""What the host-optimizer strategy's ranks exchange under data parallelism (ZeRO-2's layout,
:mod:`hpcmem.um.budget.parallel`).

Gradients: on the step's last micro-batch each gradient is copied, as autograd finishes it,
into its bucket's place in one of ``SLOTS`` device buffers of a whole (padded) bucket,
zeroed first, so a parameter without a gradient and the padding count as zeros. Once a
bucket is complete it is averaged over the ranks by a reduce-scatter into this rank's
shard, started without waiting; the buckets are reduced in index order, the same on every
rank (as DDP's buckets are: a collective must be called in the same order everywhere), so
one completed ahead of its turn waits for the buckets before it. While a bucket is
reduced, backward goes on and the next bucket fills the other slot; the reduction is
waited for when the one after it starts, and its shard is copied to the host gradient
(the bucket's job then goes to the worker). A gradient whose slot is still taken is held
where autograd left it until the slot frees.

Weights: after the step, each bucket's updated shard, uploaded into this rank's part of
its working weights, is all-gathered into every rank's, in index order as each job ends,
so the gathers overlap the host steps of the buckets after it; the next forward waits for
them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hpcmem.um.budget.offload import HostOptimizerOffload
from hpcmem.um.budget.parallel import Ranks
from hpcmem.um.budget.transport import Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.buckets import ALIGN, Bucket
from hpcmem.um.host_optimizer.worker import Stepped, Worker
from hpcmem.um.tensors import tensor_bytes

__all__ = ["SLOTS", "ShardExchange", "shard_buckets"]

#: Whole-bucket gradient buffers on the device: one filling while the other is reduced.
SLOTS = 2


class ShardExchange:
    """Reduce-scatters the gradients of ``buckets`` (in ``dtype``) and all-gathers their
    working weights across ``ranks`` (see the module docstring)."""

    def __init__(self, ranks: Ranks, transport: Transport, buckets: list[Bucket],
                 dtype: Any) -> None:
        import torch

        self.ranks = ranks
        self.transport = transport
        self.buckets = buckets
        largest = max(b.numel for b in buckets)
        device = transport.device
        self.full = [torch.empty(largest, dtype=dtype, device=device) for _ in range(SLOTS)]
        self.shards = [torch.empty(largest // ranks.size, dtype=dtype, device=device)
                       for _ in range(SLOTS)]
        self.bytes = 0  # bytes the collectives reduced and gathered since the last reset
        self._copied: list[Any] = [None] * SLOTS  # the last copy out of each shard
        self._gathers: list[Any] = []
        self.clear()

    def clear(self) -> None:
        """Ready for the next step's gradients (the last step's are all out)."""
        self._owner: list[int | None] = [None] * SLOTS  # the bucket filling or reduced from
        self._reading: list[Any] = [None] * SLOTS  # the reduction reading each slot
        self._held: dict[int, list[tuple[Any, int]]] = {}  # gradients waiting for a slot
        self._homes: dict[int, Any] = {}  # complete buckets: their host gradient
        self._reducing: deque[tuple[int, int, Any]] = deque()  # (bucket, slot, work)
        self._next = 0  # the next bucket to reduce

    def send(self, grad: Any, offset: int, index: int) -> None:
        """Gradient ``grad`` of bucket ``index``, starting at element ``offset``."""
        slot = self._claim(index)
        if slot is None:
            self._held.setdefault(index, []).append((grad, offset))
        else:
            self.full[slot][offset : offset + grad.numel()].copy_(grad.reshape(-1))

    def _claim(self, index: int) -> int | None:
        """Bucket ``index``'s slot, zeroed and filled with its held gradients when it
        first gets it; None while the bucket before it in that slot is not reduced."""
        slot = index % SLOTS
        if self._owner[slot] == index:
            return slot
        owner = self._owner[slot]
        if index >= self._next + SLOTS or (owner is not None and owner >= self._next):
            return None
        if self._reading[slot] is not None:
            self._reading[slot].wait()  # compute writes the slot after the reduction read it
            self._reading[slot] = None
        self._owner[slot] = index
        self.full[slot][: self.buckets[index].numel].zero_()
        for grad, offset in self._held.pop(index, []):
            self.full[slot][offset : offset + grad.numel()].copy_(grad.reshape(-1))
        return slot

    def complete(self, index: int, home: Any) -> list[tuple[int, Any]]:
        """Bucket ``index`` has all its gradients; its shard goes to ``home`` once reduced.
        The buckets whose shard was copied out now, each with the token of that copy."""
        self._homes[index] = home
        landed = []
        while self._next in self._homes:
            index = self._next
            landed += self._retire(keep=SLOTS - 1)  # the reduction before in its slot is out
            slot = self._claim(index)
            numel = self.buckets[index].numel
            shard = self.shards[slot][: numel // self.ranks.size]
            if self._copied[slot] is not None:
                self.transport.wait(self._copied[slot])  # the shard's last copy out is done
            work = self.ranks.reduce_scatter(shard, self.full[slot][:numel])
            self._reading[slot] = work
            self.bytes += numel * self.full[slot].element_size()
            self._reducing.append((index, slot, work))
            self._next += 1
        return landed + self._retire(keep=1)

    def drain(self) -> list[tuple[int, Any]]:
        """Every reduction started, waited for and copied out (the step's end)."""
        if self._next != len(self.buckets):
            raise RuntimeError(f"shard exchange: bucket {self._next} was never completed")
        return self._retire(keep=0)

    def _retire(self, keep: int) -> list[tuple[int, Any]]:
        """Wait for the oldest reductions, leaving ``keep`` running; copy their shards out."""
        landed = []
        while len(self._reducing) > keep:
            index, slot, work = self._reducing.popleft()
            work.wait()
            if self._reading[slot] is work:
                self._reading[slot] = None
            if self._owner[slot] == index:
                self._owner[slot] = None
            home = self._homes.pop(index)
            self._copied[slot] = self.transport.offload(self.shards[slot][: home.numel()],
                                                        home, hold=False)
            landed.append((index, self._copied[slot]))
        return landed

    def stats(self, steps: int) -> dict[str, int]:
        """The ranks, and the bytes reduced and gathered per step over ``steps``."""
        return {"world_size": self.ranks.size, "bytes_communicated": self.bytes // max(1, steps)}

    def gather(self, worker: Worker, flats: list[Any]) -> list[Stepped]:
        """The step's end: each bucket's job waited for in index order, its working
        weights ``flats[i]`` all-gathered once its upload is done, while the jobs after it
        run; the next forward waits for every gather. The jobs, done."""
        done, gathers = [], []
        for index, flat in enumerate(flats):
            job = worker.wait(index)
            if job is not None:
                done.append(job)
                if job.uploaded is not None:
                    self.transport.settle(job.uploaded)
            gathers.append(self.ranks.all_gather(flat))
            self.bytes += tensor_bytes(flat)
        for work in gathers:
            work.wait()
        self.clear()
        return done


def shard_buckets(ranks: Ranks, buckets: list[Bucket], offload: HostOptimizerOffload,
                  budget: int) -> None:
    """Pad ``buckets`` to equal, aligned shards on every rank, and refuse what data
    parallelism does not run with, or a layout that differs between the ranks."""
    for name in ("delayed_update", "gpu_share", "host_accumulation"):
        value = getattr(offload, name)
        if value:
            raise BudgetError(f"offload {name}: {value!r} is not supported with data "
                              f"parallelism (world size {ranks.size}); accepted: the default")
    for bucket in buckets:
        bucket.numel = ranks.padded(bucket.numel, ALIGN)
    ranks.check_same({
        "gpu_budget": budget,
        "trained parameters": sum(len(b.params) for b in buckets),
        "trained elements": sum(p.numel() for b in buckets for p in b.params),
        "buckets": len(buckets),
        "bucket_bytes": offload.bucket_bytes,
        "micro_batches": offload.micro_batches,
    })
