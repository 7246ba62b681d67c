"""The share of buckets the GPU steps (:mod:`.split` plans it), through a few device slots.

Each slot is plain device memory (:mod:`.staging` says why) for one bucket: an fp32
gradient, master and the optimizer's state tensors. For a bucket the GPU steps:

* buckets take the slots in the order their gradients were completed in the step the plan
  measured; its master and state come in from their page-locked homes on the
  host-to-device stream as soon as a slot is free (the copy out of the slot's last bucket
  done), ahead of its gradients;
* each gradient, as autograd completes it, is widened into the slot's gradient on the
  compute stream (the slot's gradient is zeroed when the bucket takes the slot, so a
  parameter without one steps with zero); one that comes before its bucket has a slot
  waits on the device until it has one;
* when its last gradient is in, the compute stream waits for the state, steps the slot with
  an instance of the job's optimizer class (its fused kernel, the bucket's hyperparameters
  and step count), narrows the master into the bucket's working weights, and master and
  state leave on the device-to-host stream; the host's step count follows.

Nothing crosses to the CPU optimizer: the bucket's host optimizer only keeps its state. A
bucket complete before it has a slot (an order other than the measured one) goes back to
the CPU for that step, with its waiting gradients (:meth:`DeviceStep.release`).
"""

from __future__ import annotations

from typing import Any

from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.host_optimizer.host import IMPLEMENTATION_KEYS, HostBuckets
from hpcmem.um.stream.host import HostArena
from hpcmem.um.stream.transport import Transport

__all__ = ["DeviceStep"]


class _Slot:
    """Device tensors for one bucket's step: gradient, master, state by key."""

    def __init__(self, torch: Any, numel: int, keys: list[str], device: Any) -> None:
        self.grad = torch.empty(numel, dtype=torch.float32, device=device)
        self.master = torch.empty(numel, dtype=torch.float32, device=device)
        self.states = {k: torch.empty(numel, dtype=torch.float32, device=device) for k in keys}
        self.free: Any = None  # token of the last copy out of it
        self.loaded: Any = None  # token of the copy of its bucket's master and state in


class DeviceStep:
    """Steps ``indices`` of ``host``'s buckets on ``transport``'s device (module docstring),
    taking slots in ``order`` (bucket indices in the order they completed), in ``slots``
    slots of ``slot_numel`` elements; their state moves into ``arena``."""

    def __init__(self, host: HostBuckets, flats: list[Any], transport: Transport,
                 arena: HostArena, indices: tuple[int, ...], order: list[int], slots: int,
                 slot_numel: int) -> None:
        import torch

        self._torch = torch
        self.host = host
        self.flats = flats
        self.transport = transport
        self.indices = indices
        chosen = set(indices)
        self._order = [i for i in order if i in chosen]
        self._order += [i for i in indices if i not in self._order]
        self._pin_state(arena)
        keys = self._state_keys(indices[0])
        device = transport.device
        self._slots = [_Slot(torch, slot_numel, keys, device) for _ in range(slots)]
        self._step = torch.zeros((), dtype=torch.float32, device=device)
        self._optimizers = [
            type(host.optimizers[indices[0]])([slot.master], lr=0.0, fused=True)
            for slot in self._slots
        ]
        self._begin()

    # -- set-up -------------------------------------------------------------------------
    def _state_keys(self, index: int) -> list[str]:
        state = self.host.optimizers[index].state[self.host.masters[index]]
        numel = self.host.buckets[index].numel
        return sorted(k for k, v in state.items()
                      if isinstance(v, self._torch.Tensor) and v.numel() == numel)

    def _pin_state(self, arena: HostArena) -> None:
        """Move the state of the buckets stepped here into page-locked memory."""
        for index in self.indices:
            state = self.host.optimizers[index].state[self.host.masters[index]]
            for key in self._state_keys(index):
                home = arena.take(state[key])
                home.copy_(state[key])
                state[key] = home

    def bucket_bytes(self, index: int) -> int:
        """Bytes bucket ``index`` moves each way per step: its fp32 master and state."""
        return self.host.buckets[index].numel * 4 * (1 + len(self._slots[0].states))

    # -- a step -------------------------------------------------------------------------
    def _begin(self) -> None:
        """A new step: the first buckets take the slots; their state starts coming in."""
        self._slot_of: dict[int, _Slot] = {}
        self._waiting: dict[int, list[tuple[int, Any]]] = {}  # gradients before a slot
        self._queue = list(self._order)
        for slot in self._slots:
            self._assign(slot)

    def _assign(self, slot: _Slot) -> None:
        if not self._queue:
            return
        index = self._queue.pop(0)
        self._slot_of[index] = slot
        state = self.host.optimizers[index].state[self.host.masters[index]]
        numel = self.host.buckets[index].numel
        tokens = [self.transport.upload(self.host.masters[index], slot.master[:numel],
                                        after=slot.free)]
        tokens += [self.transport.upload(state[k], slot.states[k][:numel]) for k in slot.states]
        slot.loaded = tokens[-1]
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
        """Give bucket ``index`` back to the CPU for this step: its waiting gradients."""
        self._queue.remove(index)
        return self._waiting.pop(index, [])

    def run(self, index: int) -> bool:
        """Every gradient of bucket ``index`` is in: step it, narrow it, send it home. False
        when it has no slot (the caller steps it on the CPU, :meth:`release`)."""
        if index not in self._slot_of:
            return False
        torch, slot = self._torch, self._slot_of.pop(index)
        numel = self.host.buckets[index].numel
        host_optimizer = self.host.optimizers[index]
        state = host_optimizer.state[self.host.masters[index]]
        self.transport.wait(slot.loaded)
        optimizer = self._optimizers[self._slots.index(slot)]
        group = host_optimizer.param_groups[0]
        optimizer.param_groups[0].update(
            {k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS})
        master = slot.master[:numel]
        optimizer.param_groups[0]["params"] = [master]
        master.grad = slot.grad[:numel]
        own = {k: slot.states[k][:numel] for k in slot.states}
        if "step" in state:
            self._step.fill_(float(state["step"]))
            own["step"] = self._step
        optimizer.state.clear()
        optimizer.state[master] = own
        with torch.no_grad():
            optimizer.step()
            self.flats[index].copy_(master)  # the narrowing, on the compute stream
        slot.free = self.transport.offload(master, self.host.masters[index], hold=False)
        for key, tensor in own.items():
            if key != "step":
                slot.free = self.transport.offload(tensor, state[key], hold=False)
        if "step" in state:
            state["step"] += 1
        master.grad = None
        self._assign(slot)
        return True

    def end(self) -> None:
        """The step is over (every copy done): the next one starts from the first bucket."""
        self._begin()
