"""The host-optimizer strategy: working weights on the GPU, the optimizer on the CPU.

:class:`HostOptimizer` takes over a model and its optimizer when the job's offload value is
a :class:`~hpcmem.um.budget.offload.HostOptimizerOffload`, given or planned:

* set-up (:mod:`.parts`): the trained parameters are laid out in buckets; each bucket's
  fp32 master weights, gradient and optimizer state move to host memory, its working
  weights to plain device memory (:mod:`.staging` says why);
* backward: on the last micro-batch of a step, each gradient is copied into the out ring
  (:class:`.staging.OutRing`) in the dtype the bucket kernel reads (:mod:`.kernel`: the
  working dtype for hpcmem's Adam, fp32 for PyTorch's kernel) as soon as autograd has
  accumulated it (``post_accumulate_grad`` hook), and freed; once a bucket's gradients
  are all in, they go from the ring to its page-locked gradient (one copy, on the
  device-to-host stream) and the bucket to the worker thread (:mod:`.worker`), which
  steps it on the CPU and copies its updated weights up once the compute stream is done
  with the old ones (an fp32 master narrowed into them on the device), while backward goes
  on; earlier micro-batches accumulate in ``param.grad`` on the device (in host memory,
  :mod:`.part_sums`, where a gradient set does not fit beside the working weights);
* ``optimizer.step()``: sends what backward left (a step before the last micro-batch, a
  parameter without a gradient), waits for the worker and for the last weight copy, so the
  next forward reads updated weights;
* from the steady phase on (:class:`~hpcmem.um.budget.phases.Phase`), the budget's room
  above what a step held is spent on buckets the GPU steps (:mod:`.split` plans it from the
  measured steps, :mod:`.device_step` runs it): streamed when the CPU optimizer outlasts
  backward, kept on the device with the room left.

Under ``HostOptimizerOffload(delayed_update=True)`` ``optimizer.step()`` does not wait for
the CPU (:mod:`.delayed`).

Under data parallelism (``ranks``) each rank's host holds a shard of every bucket, its
gradients reduce-scattered and its weights all-gathered (:mod:`.exchange`). Clipping by
global norm (:mod:`.clip`) steps the buckets after backward, scaled.

The first step is the probe: it measures the device bytes one step needs, everything
outside the managed pools included (:meth:`Transport.outside_bytes`); a budget below them
is refused (:class:`BudgetTooSmallError`, naming what makes the floor up), and the last
blocks stop being recomputed, as many as the room holds what they save. A Hugging Face
causal LM's batch is split in its forward where the room lacks its activations
(:mod:`hpcmem.um.budget.batch_split`; the first forward measures rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from hpcmem.um.budget.batch_split import BatchSplit, Measure
from hpcmem.um.budget.floor import TARGET_FRACTION
from hpcmem.um.budget.offload import HostOptimizerOffload, sums_micro_batches_on_host
from hpcmem.um.budget.parallel import Ranks
from hpcmem.um.budget.phases import Phase
from hpcmem.um.budget.recompute import Recompute
from hpcmem.um.budget.transport import BANDWIDTH_PROBE_BYTES, Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.checkpoint import Checkpoints
from hpcmem.um.host_optimizer.clip import Clip
from hpcmem.um.host_optimizer.delayed import Delayed
from hpcmem.um.host_optimizer.device_step import DeviceStep, plan_device_step
from hpcmem.um.host_optimizer.host import check_supported
from hpcmem.um.host_optimizer.ledger import Ledger, StepTimes, median_times
from hpcmem.um.host_optimizer.part_sums import PartSums
from hpcmem.um.host_optimizer.parts import make_parts
from hpcmem.um.host_optimizer.pending import adopt, refused_grads, take
from hpcmem.um.host_optimizer.placement import PlainMemory
from hpcmem.um.host_optimizer.probe import probe
from hpcmem.um.host_optimizer.record import record
from hpcmem.um.host_optimizer.split import PLAN_AFTER, Split
from hpcmem.um.host_optimizer.worker import Stepped
from hpcmem.um.tensors import tensor_bytes

__all__ = ["HostOptimizer"]

class HostOptimizer:
    """``model`` and ``optimizer`` trained within ``budget`` device bytes (module docstring).

    ``device_scope()`` routes device allocations to where the budget counts them;
    ``plain_scope()`` lets them be plain device memory (the copies' device ends).
    """

    def __init__(self, model: Any, optimizer: Any, *, transport: Transport, budget: int,
                 offload: HostOptimizerOffload,
                 device_scope: Callable[[], AbstractContextManager[None]],
                 plain_scope: Callable[[], AbstractContextManager[None]] = nullcontext,
                 ranks: Ranks | None = None, batch_split: BatchSplit | None = None) -> None:
        import torch

        check_supported(optimizer)
        self._torch = torch
        self.transport = transport
        self.budget = budget
        self.offload = offload
        self.optimizer = optimizer
        self.device_scope = device_scope
        transport.timing = True
        self.bandwidth = transport.bandwidth(min(BANDWIDTH_PROBE_BYTES, budget // 32))
        if transport.device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's buffers are not this job's to keep
        self._base_bytes = transport.live_bytes()
        self._plain = PlainMemory(transport.device, plain_scope)
        pending = take(model)  # attached after a backward (:mod:`.pending`)
        parts = make_parts(model, optimizer, transport=transport, budget=budget,
                           offload=offload, ranks=ranks, device_scope=device_scope,
                           plain=self._plain)
        self.working_dtype, self.buckets, self.arena, self.host = (
            parts.working_dtype, parts.buckets, parts.arena, parts.host)
        self.flats, self.worker, self.ring, self.exchange, self.gpu_node = (
            parts.flats, parts.worker, parts.ring, parts.exchange, parts.gpu_node)
        self.working_bytes = sum(map(tensor_bytes, self.flats))  # on the device, fixed
        optimizer.state.clear()  # the host holds it now
        self.delayed = Delayed(self.worker, transport)
        adopt(pending)
        self.clip = Clip(offload.max_grad_norm, ranks) if offload.max_grad_norm else None
        self._where = {id(p): (b.index, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in parts.trained]
        self.ledger = Ledger(transport, self.bandwidth)
        #: earlier micro-batches' gradients summed in host memory (``part_sums``)
        self.micro_sums = ranks is None and self.ring is not None and sums_micro_batches_on_host(
            self.working_bytes, offload.micro_batches, budget, offload.host_accumulation)
        self.part_sums = None if (self.ring is None or offload.host_accumulation is False or (
            offload.micro_batches > 1 and not self.micro_sums)) else PartSums(
            self.buckets, self.host, self.ring, self.worker, transport, self.arena, self.ledger,
            always=bool(offload.host_accumulation), parity=lambda: self._parity)
        self.recompute = Recompute.of(model, transport.live_bytes)
        if offload.recompute is not False:
            self.recompute.enable()
        self.batch_split = batch_split
        if batch_split is not None:
            batch_split.bind(Measure.of(transport, self._split_room, parts.trained,
                                        None if self.micro_sums else self.part_sums))
        self._original_step = optimizer.__dict__.get("step")
        optimizer.step = self.step
        self.checkpoints = Checkpoints(model, optimizer, self.host, self.settle, self._reload)
        self.probe_bytes: int | None = None  # what the first step held on the device
        self.refused = False  # the probe refused the budget
        self._held: list[tuple[int, Any, list[int], Any]] = []  # jobs the probe holds back
        self.outside_bytes = 0  # of which outside the managed pools (context, plain memory)
        self.split: Split | None = None  # planned after step PLAN_AFTER
        self.device_step: DeviceStep | None = None
        self._measured: list[StepTimes] = []  # the steps of Phase.MEASURE
        self._steps = 0  # optimizer steps done
        self._micro = 0  # since the last optimizer step
        self._delayed = False  # this step's update is delayed (module docstring)
        self._parity = 0  # the gradient buffer this step's gradients land in
        self._begin_step()
        transport.reset_peak()

    def _split_room(self) -> int:
        """What a split forward may fill (live bytes): the budget's planned share less the
        CUDA context and workspaces, which lie outside the pools and the plain buffers."""
        context = max(0, self.transport.outside_bytes() - self.plain_bytes)
        return int(TARGET_FRACTION * self.budget) + self._base_bytes - context

    @property
    def plain_bytes(self) -> int:
        """Device bytes of the copies' buffers and working weights (plain device memory)."""
        return self._plain.bytes

    # -- forward and backward ---------------------------------------------------------------
    @contextmanager
    def scope(self) -> Iterator[None]:
        """One forward and backward (a micro-batch); the probe's budget check after the first."""
        self._micro += 1
        if self.micro_sums and self._micro == 1:
            self.part_sums.begin(micro_batches=True)
        start = self.transport.mark()
        try:
            yield
        finally:
            self.ledger.computed(start, self.transport.mark())
        if self.micro_sums and self._micro < self.offload.micro_batches:
            self.part_sums.part_done()
        if self.probe_bytes is None:  # the floor and the blocks recomputed (:mod:`.probe`)
            self.outside_bytes = self.transport.outside_bytes()
            self.refused = True  # until it passes; :meth:`close` then gives gradients back
            self.probe_bytes = probe(self)
            self.refused = False
            self._release_held()

    def _on_grad(self, param: Any) -> None:
        """A gradient is complete: on the step's last micro-batch, send it to the host
        (not while a split batch's parts run: their sum comes after them)."""
        split = self.batch_split
        if split is not None and split.dropping:
            param.grad = None  # the split's measuring row: no step takes it
            return
        index, position = self._where[id(param)]
        running = split is not None and split.running
        if (running and split.host_summed) or (
                self.micro_sums and self._micro < self.offload.micro_batches and not running):
            self.part_sums.send(index, position, param.grad)  # an earlier part's or micro-batch's
            param.grad = None
            return
        if self._micro < self.offload.micro_batches or running:
            return  # accumulates on the device
        if self._first_grad is None:
            self._first_grad = self.transport.mark()
        if self._submitted[index]:
            raise BudgetError(f"offload host_optimizer: more backward passes before "
                              f"optimizer.step() than micro_batches={self.offload.micro_batches}")
        self._ship(index, position, param)
        if not self._left[index]:
            self._submit(index, [])

    def _ship(self, index: int, position: int, param: Any) -> None:
        if self.device_step is not None and self.device_step.holds(index):
            self.device_step.take_grad(self.buckets[index], position, param.grad)
        else:
            self._send(index, position, param.grad)
        param.grad = None
        self._left[index].discard(position)

    def _send(self, index: int, position: int, grad: Any) -> None:
        """A gradient for the CPU: into the out ring (in the kernel's dtype), out with the
        rest of its bucket (:meth:`_submit`)."""
        bucket, home = self.buckets[index], self.host.grads[self._parity][index]
        if self.exchange is not None:  # reduced first: the shard's bytes count when it lands
            self.exchange.send(grad, bucket.offsets[position], index)
            return
        if self._summing:  # the last part's, added to the earlier parts' sum
            self.part_sums.send(index, position, grad)
            return
        self.ring.send(grad, home, bucket.offsets[position], key=index)
        self.ledger.d2h += grad.numel() * home.element_size()

    def _submit(self, index: int, missing: list[int]) -> None:
        self._submitted[index] = True
        self._order.append(index)
        before = self.delayed.catch_up(index)
        self.host.sync(self.optimizer.param_groups, index)
        if self.device_step is not None and self.device_step.holds(index):
            if self.device_step.run(index):  # a missing gradient is the slot's zeros
                moved = self.device_step.bucket_bytes(index)
                self.ledger.h2d += moved
                self.ledger.d2h += moved
                return
            for position, grad in self.device_step.release(index):
                self._send(index, position, grad)
        if self.exchange is None:
            if self._summing:
                self.part_sums.finish(index)
            self._to_worker(index, self.ring.flush(index), missing, before)
        else:  # a missing gradient is reduced as zeros
            for reduced, landed in self.exchange.complete(index, self.host.grads[0][index]):
                self._to_worker(reduced, landed, [], None)

    def _to_worker(self, index: int, landed: Any, missing: list[int], before: Any) -> None:
        """Bucket ``index``'s gradient lands with ``landed``: the worker steps (or measures) it."""
        if self.clip:
            self.worker.measure(index, landed, missing, parity=self._parity)
        elif self.probe_bytes is None:  # the probe may refuse the budget: nothing steps yet
            self._held.append((index, landed, missing, before))
        else:
            self.worker.submit(index, landed, None if self._delayed else self.transport.mark(),
                               missing, parity=self._parity, before=before)
        self.ledger.d2h += tensor_bytes(self.host.grads[0][index]) if self.exchange else 0
        self.ledger.h2d += tensor_bytes(self.host.upload_source(index))

    # -- the optimizer step ---------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Finish the step: what backward left, the worker, the weights' last copy.

        ``closure`` (torch.optim's: a forward and backward, returning the loss, as Lightning
        passes it) runs first, once; its loss is returned.
        """
        loss = None
        if closure is not None:
            with self._torch.enable_grad():
                loss = closure()
        self.send_the_rest()
        self._release_held()  # no scope ran the probe
        for index, landed in self.exchange.drain() if self.exchange else ():
            self._to_worker(index, landed, [], None)
        if self.clip:  # every gradient is in: each bucket steps scaled (none: not finite)
            scale = self.clip.scale(self.worker.squares())
            for index in range(len(self.buckets)) if scale is not None else ():
                self.worker.submit(index, None, self.transport.mark(), [], scale=scale)
        if self._delayed:  # the GPU's buckets finished now: it reads their masters next
            done = self.delayed.finish(self.split.gpu_buckets if self.split else ())
            self._parity ^= 1
        else:
            done = self._finish()
        times = self.ledger.stepped(done, self._first_grad)
        phase, self._steps = self.phase, self._steps + 1
        if self.device_step is not None:
            self.device_step.end()
        elif phase is Phase.MEASURE and self.offload.gpu_share != 0 and not self.micro_sums:
            self._measured.append(times)
            if self.phase is Phase.STEADY:
                times = median_times(self._measured)
                self.split, self.device_step = plan_device_step(self, times)
        self._delayed = self.offload.delayed_update and self.phase is Phase.STEADY
        self._begin_step()
        return loss

    def send_the_rest(self) -> None:
        """Every bucket not sent yet out: the gradients backward left, none for the rest."""
        for bucket in self.buckets:
            if self._submitted[bucket.index]:
                continue
            missing = []
            for position in sorted(self._left[bucket.index]):
                param = bucket.params[position]
                if param.grad is not None:
                    self._ship(bucket.index, position, param)
                elif not (self._summing and self.part_sums.holds(bucket.index, position)):
                    missing.append(position)
            self._submit(bucket.index, missing)

    def _release_held(self) -> None:
        """The buckets held while the probe could refuse the budget, to the worker."""
        for index, landed, missing, before in self._held:
            self.worker.submit(index, landed, self.transport.mark(), missing,
                               parity=self._parity, before=before)
        self._held = []

    def _finish(self) -> list[Stepped]:
        """The step's jobs done and their weights up: the next forward reads them, and the
        gradients held for their copies are free again (the device is idle until then)."""
        done = (self.exchange.gather(self.worker, self.flats) if self.exchange
                else self.worker.drain())
        self.transport.synchronize()
        if self.ring is not None:
            self.ring.clear()
        return done

    def settle(self) -> None:
        """Every bucket's host step done and its master final (a checkpoint reads them);
        delayed updates are caught up and their weights sent up."""
        for index in range(len(self.buckets)):
            self.delayed.catch_up(index)
        self.transport.synchronize()
        if self.device_step is not None:
            self.device_step.write_back()

    def _reload(self) -> None:
        """Masters and state were loaded into the host: the GPU's own copies follow."""
        if self.device_step is not None:
            self.device_step.reload()

    @property
    def phase(self) -> Phase:
        """The phase of the step under way (:class:`Phase`)."""
        return Phase.of(self._steps + 1, PLAN_AFTER)

    @property
    def _summing(self) -> bool:
        """Whether this step's split batch, or its micro-batches, sum their gradients in host
        memory."""
        return self.part_sums is not None and self.part_sums.active

    def _begin_step(self) -> None:
        self.recompute.saved_bytes.clear()  # the probe read the first step's
        if self.part_sums is not None:
            self.part_sums.end_step()
        self._micro = 0
        self._left = [set(range(len(b.params))) for b in self.buckets]
        self._submitted = [False] * len(self.buckets)
        self._first_grad: Any = None  # the mark at the step's first gradient sent
        self._order: list[int] = []  # buckets in the order they were submitted

    # -- statistics and lifetime ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per step: bytes each way and busy time, compute and CPU optimizer time, the bound."""
        return record(self)

    def replan(self) -> dict[str, int]:
        """The device bytes kept: working weights and the copies' buffers (fixed at set-up)."""
        return {"working": self.working_bytes, "staging": self.plain_bytes - self.working_bytes}

    def reset_stats(self) -> None:
        """Counts and peaks from now on (e.g. after warm-up)."""
        self.ledger.reset()
        self.transport.reset_peak()
        if self.exchange is not None:
            self.exchange.bytes = 0

    def close(self) -> None:
        """Remove hooks; masters and state go back to the parameters and the optimizer
        (fp32, in host memory); after a refused probe, the step's gradients to ``.grad``."""
        pending = refused_grads(self) if self.refused and self.exchange is None else {}
        if self.batch_split is not None:
            self.batch_split.bind(None)  # a strategy after this one runs batches whole
        self.worker.close()
        self.transport.synchronize()
        if self.device_step is not None:
            self.device_step.write_back()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self.checkpoints.remove()
        self.recompute.disable()
        if self.optimizer.__dict__.get("step") == self.step:
            if self._original_step is None:
                del self.optimizer.step
            else:
                self.optimizer.step = self._original_step
        self.host.give_back(self.optimizer)
        adopt(pending)
        self.arena.close()
