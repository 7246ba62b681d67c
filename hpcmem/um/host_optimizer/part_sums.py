"""A split batch's earlier parts, or a step's earlier micro-batches, summed in host memory,
where the device lacks the room for a gradient set beside a part or beside the working
weights (``HostOptimizerOffload(host_accumulation=)``).

The batch split (:mod:`hpcmem.um.budget.batch_split`) runs every part but the last forward
and backward inside the model's forward; their gradients sum until the last part's backward,
on the device a whole gradient set beside the part's activations. Summed here instead, each
part's gradients leave the device as they land, through the out ring
(:class:`~.staging.OutRing`), as the last part's do:

* the first part's into the bucket's own gradient buffer, later parts' into a page-locked
  ``incoming`` buffer of the bucket (made at first use), which the worker thread
  (:class:`~.worker.Worker`, in order with its steps) adds into the gradient buffer once the
  part's backward is over and the copies have landed; a bucket's next part waits for that
  add before its copies reach ``incoming``;
* the last part's into ``incoming`` too: once the bucket is complete, the worker makes its
  gradient ``last + scale * earlier`` and steps it. ``scale`` is the loss's gradient, which
  the loop's backward gives the earlier parts' loss (its own scaling: accumulation, a loss
  scaler), copied to the host as that backward starts.

A step's micro-batches (``Offload(micro_batches=N)``) sum the same way, a micro-batch a
part, with a scale of 1: each micro-batch's backward is the loop's, scaled already.

What it costs: every part's gradients cross PCIe, and the CPU reads and writes a gradient
buffer per part (memory-bandwidth bound, beside the CPU optimizer). A parameter that has a
gradient in some parts only is summed over those; one with none is stepped as missing.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.transport import Transport
from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.host_optimizer.host import HostBuckets
from hpcmem.um.host_optimizer.ledger import Ledger
from hpcmem.um.host_optimizer.staging import OutRing
from hpcmem.um.host_optimizer.worker import Worker

__all__ = ["PartSums"]


class PartSums:
    """The earlier parts' gradients of ``buckets``, summed in ``host``'s gradient buffers (see
    the module docstring); ``always``: every split forward's parts (else only where the
    split finds no room for a gradient set beside a part)."""

    def __init__(self, buckets: list[Bucket], host: HostBuckets, ring: OutRing,
                 worker: Worker, transport: Transport, arena: HostArena, ledger: Ledger,
                 *, always: bool, parity: Callable[[], int]) -> None:
        import torch

        self._torch = torch
        self.buckets, self.host, self.ring, self.worker = buckets, host, ring, worker
        self.transport, self.arena, self.ledger = transport, arena, ledger
        self.always = always
        self._parity_now = parity  # the gradient buffers the step's gradients land in
        self.active = False  # this step's parts are summed here
        self.used = False  # some step's were
        self._incoming: list[Any] = []  # per bucket, made at first use
        self._parity = 0  # the gradient buffers of this step
        self._part = 0  # the part whose gradients land now
        self._summed: list[set[int]] = [set() for _ in buckets]  # positions summed so far
        self._landing: list[set[int]] = [set() for _ in buckets]  # of the part landing now
        self._folds: dict[int, Future[None]] = {}  # per bucket, its last add
        self._done: list[Future[None]] = []  # this step's adds
        self._scale = transport.host_empty((1,), torch.float32)
        self._scale_token: Any = None

    # -- the split's side (``HostSums``) -------------------------------------------------
    def begin(self, micro_batches: bool = False) -> None:
        """A split forward's parts, or a step's ``micro_batches``, begin; their gradients
        come here (a micro-batch's, scaled by its own backward, sum as they are)."""
        if not self._incoming:
            self._incoming = [self.arena.take(self._torch.empty(
                g.numel(), dtype=g.dtype, device="meta")) for g in self.host.grads[0]]
        self.active = self.used = True
        self._parity, self._part = self._parity_now(), 0
        if micro_batches:
            self._scale[0], self._scale_token = 1.0, None

    def part_done(self) -> None:
        """An earlier part's backward is over: its copies go out, and the worker sums them."""
        for index, landed in enumerate(self._landing):
            if landed:
                self._fold(index, last=False)
        self._part += 1

    def scale(self, value: Any) -> None:
        """The loop's backward began with the loss's gradient ``value`` (a scalar tensor)."""
        self._scale_token = self.transport.offload(
            value.detach().float().reshape(1), self._scale, hold=True)

    # -- the strategy's side ----------------------------------------------------------------
    def send(self, index: int, position: int, grad: Any) -> None:
        """A part's gradient of bucket ``index``, ``position``: out through the ring."""
        fold = self._folds.pop(index, None)
        if fold is not None:
            fold.result()  # its add read ``incoming``: done before a copy writes it again
        home = self.host.grads[self._parity][index] if self._part == 0 else (
            self._incoming[index])
        self.ring.send(grad, home, self.buckets[index].offsets[position], key=index)
        self._landing[index].add(position)
        self.ledger.d2h += grad.numel() * home.element_size()

    def holds(self, index: int, position: int) -> bool:
        """Whether an earlier part gave bucket ``index``'s ``position`` a gradient."""
        return self.active and position in self._summed[index]

    def finish(self, index: int) -> None:
        """Bucket ``index``'s last part is in: the worker makes its gradient (the module
        docstring) ahead of the step submitted next."""
        if self._landing[index] or self._summed[index]:
            self._fold(index, last=True)

    def end_step(self) -> None:
        """The step is over: raise what an add raised; the next step starts afresh."""
        done, self._done = self._done, []
        self._folds.clear()
        for future in done:
            future.result()
        self.active = False
        for positions in (*self._summed, *self._landing):
            positions.clear()

    def _fold(self, index: int, last: bool) -> None:
        """The worker adds what bucket ``index`` has landed of this part to its sum (the
        last part: ``last + scale * earlier``)."""
        landed, summed = set(self._landing[index]), bool(self._summed[index])
        future = self.worker.call(self._sum, index, self.ring.flush(index), landed,
                                  self._part == 0, summed, last)
        self._folds[index] = future
        self._done.append(future)
        self._summed[index] |= landed
        self._landing[index].clear()

    def _sum(self, index: int, token: Any, landed: set[int], in_home: bool, summed: bool,
             last: bool) -> None:
        """On the worker, once ``token`` (the copies out) is done: the part's gradients,
        the positions that had none zeroed, into the sum; the first part's are there."""
        if token is not None:
            self.transport.settle(token)
        bucket, home = self.buckets[index], self.host.grads[self._parity][index]
        part = home if in_home else self._incoming[index]
        for position in set(range(len(bucket.params))) - landed:
            bucket.slot(part, position).zero_()
        if in_home:
            return
        if not summed:
            home.copy_(part)
        elif last:
            if self._scale_token is not None:
                self.transport.settle(self._scale_token)
            self._torch.add(part, home, alpha=float(self._scale[0]), out=home)
        else:
            home.add_(part)
