"""The buckets the GPU steps (:mod:`.split` plans them): kept on the device, or streamed.

Each bucket the GPU steps has its fp32 gradient, master and optimizer state tensors in a
slot of plain device memory (:mod:`.staging` says why). A **resident** bucket has a slot of
its own for good: its master and state came in once, and stay. A **streamed** bucket takes
one of a few shared slots for the step:

* buckets take the slots in the order their gradients were completed in the step the plan
  measured; its master and state come in from their page-locked homes on the
  host-to-device stream as soon as a slot is free (the copy out of the slot's last bucket
  done), ahead of its gradients;
* one of its gradients that comes before it has a slot waits on the device until it has one.

Each gradient, as autograd completes it, is widened into the slot's gradient on the
compute stream (the slot's gradient is zeroed when the step begins or the bucket takes the
slot, so a parameter without one steps with zero). When its last gradient is in, a stream
of its own waits for the compute stream and for the state, steps the slot with an instance
of the job's optimizer class (its fused kernel, the bucket's hyperparameters and step
count), and narrows the master into the bucket's working weights; a streamed bucket's
master and state then leave on the device-to-host stream. The compute stream never waits
for a copy: only for a slot's last step before it takes new gradients, and, at the end of
the optimizer step, for the narrowed weights. The host's step count follows.

Nothing crosses to the CPU optimizer: the bucket's host optimizer only keeps its state
(a resident bucket's is written back by :meth:`DeviceStep.write_back`). A streamed bucket
complete before it has a slot (an order other than the measured one) goes back to the CPU
for that step, with its waiting gradients (:meth:`DeviceStep.release`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from hpcmem.um.budget.batch_split import BatchSplit
from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.transport import Transport
from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.host_optimizer.host import IMPLEMENTATION_KEYS, HostBuckets
from hpcmem.um.host_optimizer.ledger import StepTimes
from hpcmem.um.host_optimizer.split import ROOM_MARGIN, SLOTS, Split, plan_split, slot_bytes

__all__ = ["DeviceStep", "plan_device_step", "share_room"]


class _Slot:
    """Device tensors for one bucket's step: gradient, master, state by key."""

    def __init__(self, torch: Any, numel: int, keys: list[str], device: Any) -> None:
        self.grad = torch.empty(numel, dtype=torch.float32, device=device)
        self.master = torch.empty(numel, dtype=torch.float32, device=device)
        self.states = {k: torch.empty(numel, dtype=torch.float32, device=device) for k in keys}
        self.free: Any = None  # token of the last copy out of it
        self.loaded: Any = None  # token of the copy of its bucket's master and state in
        self.stepped: Any = None  # token of its last step


class DeviceStep:
    """Steps ``split``'s buckets of ``host`` on ``transport``'s device (module docstring):
    the resident ones in slots of their own, the streamed ones in ``split.slots`` shared
    slots taken in ``order`` (bucket indices in the order they completed); the streamed
    buckets' state moves into ``arena``."""

    def __init__(self, host: HostBuckets, flats: list[Any], transport: Transport,
                 arena: HostArena, split: Split, order: list[int]) -> None:
        import torch

        self._torch = torch
        self.host = host
        self.flats = flats
        self.transport = transport
        chosen = set(split.streamed_buckets)
        self._order = [i for i in order if i in chosen]
        self._order += [i for i in split.streamed_buckets if i not in self._order]
        for index in split.gpu_buckets:
            host.widen_state(index)  # the device's step keeps fp32 state
        any_index = split.gpu_buckets[0]
        keys = host.state_keys(any_index)
        device = transport.device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._resident = {i: _Slot(torch, host.buckets[i].numel, keys, device)
                          for i in split.resident_buckets}
        for index, slot in self._resident.items():
            self._load(index, slot)
        self._pin_state(arena, split.streamed_buckets)
        self._slots = [_Slot(torch, split.slot_numel, keys, device) for _ in range(split.slots)]
        self._step = torch.zeros((), dtype=torch.float32, device=device)
        self._optimizer = type(host.optimizers[any_index])([self._step.new_zeros(1)],
                                                           lr=0.0, fused=True)
        self._begin()

    # -- set-up -------------------------------------------------------------------------
    def _pin_state(self, arena: HostArena, indices: tuple[int, ...]) -> None:
        """Move the state of the streamed buckets into page-locked memory."""
        for index in indices:
            state = self.host.state(index)
            for key in self.host.state_keys(index):
                home = arena.take(state[key])
                home.copy_(state[key])
                state[key] = home

    def _load(self, index: int, slot: _Slot) -> None:
        """A resident bucket's master and state into its slot."""
        state = self.host.state(index)
        slot.master.copy_(self.host.masters[index])
        for key, tensor in slot.states.items():
            tensor.copy_(state[key])

    def bucket_bytes(self, index: int) -> int:
        """Bytes bucket ``index`` moves each way per step: a streamed one's fp32 master and
        state, a resident one's nothing."""
        if index in self._resident:
            return 0
        return self.host.buckets[index].numel * 4 * (1 + len(self._slots[0].states))

    # -- a step -------------------------------------------------------------------------
    def _begin(self) -> None:
        """A new step: the resident gradients zeroed; the first streamed buckets take the
        slots, and their state starts coming in."""
        for slot in self._resident.values():
            slot.grad.zero_()
        self._slot_of: dict[int, _Slot] = dict(self._resident)
        self._waiting: dict[int, list[tuple[int, Any]]] = {}  # gradients before a slot
        self._queue = list(self._order)
        for slot in self._slots:
            self._assign(slot)

    def _assign(self, slot: _Slot) -> None:
        if not self._queue:
            return
        index = self._queue.pop(0)
        self._slot_of[index] = slot
        state = self.host.state(index)
        numel = self.host.buckets[index].numel
        tokens = [self.transport.upload(self.host.masters[index], slot.master[:numel],
                                        after=slot.free)]
        tokens += [self.transport.upload(state[k], slot.states[k][:numel]) for k in slot.states]
        slot.loaded = tokens[-1]
        if slot.stepped is not None:
            self.transport.wait(slot.stepped)
        slot.grad[:numel].zero_()  # on the compute stream, after the slot's last step
        bucket = self.host.buckets[index]
        for position, grad in self._waiting.pop(index, []):
            bucket.slot(slot.grad, position).copy_(grad)

    def holds(self, index: int) -> bool:
        """Whether the GPU steps bucket ``index``."""
        return index in self._slot_of or index in self._queue

    def take_grad(self, bucket: Bucket, position: int, grad: Any) -> None:
        """Widen a completed gradient of ``bucket`` into its slot (keep it until the bucket
        has one)."""
        slot = self._slot_of.get(bucket.index)
        if slot is None:
            self._waiting.setdefault(bucket.index, []).append((position, grad))
        else:
            bucket.slot(slot.grad, position).copy_(grad)

    def release(self, index: int) -> list[tuple[int, Any]]:
        """Give streamed bucket ``index`` back to the CPU for this step: its waiting
        gradients."""
        self._queue.remove(index)
        return self._waiting.pop(index, [])

    def run(self, index: int) -> bool:
        """Every gradient of bucket ``index`` is in: step it, narrow it, send a streamed one
        home. False when it has no slot (the caller steps it on the CPU, :meth:`release`)."""
        if index not in self._slot_of:
            return False
        slot = self._slot_of.pop(index)
        numel = self.host.buckets[index].numel
        state = self.host.state(index)
        ready = self.transport.mark()  # the slot's gradients, on the compute stream
        with self._own_stream():
            self.transport.wait(ready)
            own = self._stepped(index, slot, numel)
            if index not in self._resident:
                slot.free = self.transport.offload(slot.master[:numel],
                                                   self.host.masters[index], hold=False)
                for key, tensor in own.items():
                    slot.free = self.transport.offload(tensor, state[key], hold=False)
            slot.stepped = self.transport.mark()
        if "step" in state:
            state["step"] += 1
        if index not in self._resident:
            self._assign(slot)
        return True

    def _own_stream(self) -> Any:
        """The device step's stream as the current one (on the CPU: nothing to switch)."""
        if self._stream is None:
            return nullcontext()
        return self._torch.cuda.stream(self._stream)

    def _stepped(self, index: int, slot: _Slot, numel: int) -> dict[str, Any]:
        """Step bucket ``index`` in ``slot`` with the job's optimizer's fused kernel and
        narrow its master into the working weights; the state tensors it stepped."""
        torch = self._torch
        if slot.loaded is not None:
            self.transport.wait(slot.loaded)
        state = self.host.state(index)
        group = self._optimizer.param_groups[0]
        group.update({k: v for k, v in self.host.optimizers[index].param_groups[0].items()
                      if k not in IMPLEMENTATION_KEYS})
        master = slot.master[:numel]
        group["params"] = [master]
        master.grad = slot.grad[:numel]
        own = {k: slot.states[k][:numel] for k in slot.states}
        self._optimizer.state.clear()
        if "step" in state:
            self._step.fill_(float(state["step"]))
            self._optimizer.state[master] = {**own, "step": self._step}
        else:
            self._optimizer.state[master] = dict(own)
        with torch.no_grad():
            self._optimizer.step()
            self.flats[index].copy_(master)  # the narrowing, on the device step's stream
        master.grad = None
        return own

    def end(self) -> None:
        """The step is over (every copy done): the next forward waits for the narrowed
        weights, and the next step starts from the first bucket."""
        if self._stream is not None:
            self._torch.cuda.current_stream(self.transport.device).wait_stream(self._stream)
        self._begin()

    def reload(self) -> None:
        """The resident buckets' master and state again from their host homes (loaded)."""
        if self._stream is not None:
            self._stream.synchronize()
        for index, slot in self._resident.items():
            self._load(index, slot)

    def write_back(self) -> None:
        """The resident buckets' master and state back into their host homes."""
        if self._stream is not None:
            self._stream.synchronize()
        for index, slot in self._resident.items():
            state = self.host.state(index)
            self.host.masters[index].copy_(slot.master)
            for key, tensor in slot.states.items():
                state[key].copy_(tensor)


def share_room(budget: int, held: int, batch_split: BatchSplit | None) -> int:
    """Device bytes the GPU's share of the optimizer may take: the budget's room above the
    ``held`` bytes a step held, and never what keeps the batch ``batch_split`` measured
    whole where it runs whole. Split, it would pay a forward and backward a part, more than
    the CPU optimizer time the share saves, which backward overlaps anyway."""
    room = int((1 - ROOM_MARGIN) * budget) - held
    whole = batch_split.whole_bytes() if batch_split is not None else None
    if whole is not None and batch_split.measure is not None:
        room = min(room, batch_split.measure.room() - whole)
    return room


def plan_device_step(engine: Any, times: StepTimes) -> tuple[Split | None, DeviceStep | None]:
    """The buckets ``engine`` (a :class:`~.engine.HostOptimizer`) has the GPU step from now on,
    planned from its median step ``times``: the budget's room above what a step held is spent
    on buckets streamed when the CPU optimizer outlasts backward, kept on the device with the
    rest of the room (:mod:`.split`). None for both under several ranks, clipping, a split
    batch summed in host memory, or where the CPU computes the model too."""
    offload, transport, sums = engine.offload, engine.transport, engine.part_sums
    if engine.exchange or engine.clip or (sums is not None and sums.used) or (
            transport.device.type != "cuda" and offload.gpu_share is None):
        return None, None
    held = max(engine.probe_bytes or 0,
               transport.resident_peak_bytes() + transport.outside_bytes())
    per_step = engine.ledger.per_step()
    window_ms = times.compute_ms if offload.delayed_update else times.backward_ms

    def plan(room: int) -> Split:
        return plan_split(
            window_ms=window_ms, cpu_ms=times.cpu_ms,
            bucket_numels=[b.numel for b in engine.buckets], order=engine._order,
            states=engine.host.state_count(),
            bytes_h2d=per_step["bytes_h2d"], bytes_d2h=per_step["bytes_d2h"],
            bandwidth=engine.bandwidth, asked=offload.gpu_share, room_bytes=room,
        )

    room = share_room(engine.budget, held, engine.batch_split)
    split = plan(room)
    if not split.share and offload.gpu_share is None:
        split = _slots_from_kept_blocks(engine, times, window_ms, room, plan) or split
    if not split.share:
        return split, None
    if engine.batch_split is not None and engine.batch_split.measure is not None:
        # the slots take the room: a later split's parts sum on the device
        engine.batch_split.bind(replace(engine.batch_split.measure, host_sums=None))
    with engine._plain():
        return split, DeviceStep(engine.host, engine.flats, transport, engine.arena, split,
                                 engine._order)


def _slots_from_kept_blocks(engine: Any, times: StepTimes, window_ms: float, room: int,
                            plan: Callable[[int], Split]) -> Split | None:
    """The split ``plan`` makes where the earliest blocks whose activations the probe kept
    are recomputed again, their bytes going to the streamed share's slots; None, changing
    nothing, where the share would not take the slots' room beside ``room``, or the
    forwards it costs take more than half the time the CPU optimizer ran past its
    ``window_ms`` (a block's forward taken as a third of its share of the compute)."""
    recompute, states = engine.recompute, engine.host.state_count()
    need = SLOTS * slot_bytes(max(b.numel for b in engine.buckets), states) - room
    over_ms = times.cpu_ms - window_ms
    if over_ms <= 0 or need <= 0 or not recompute.kept or not plan(room + need).share:
        return None
    block_ms = times.compute_ms / (3 * len(recompute.blocks))
    taken, freed = recompute.take_back(need, int(over_ms / 2 / block_ms))
    if not taken:
        return None
    if engine.batch_split is not None:
        engine.batch_split.add_kept(-freed)
    split = plan(room + freed)
    return replace(split, why=f"{split.why}; {taken} kept blocks recomputed again for "
                              f"the slots, {freed} bytes")
