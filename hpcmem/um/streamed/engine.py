"""The streamed budget strategy: a model and optimizer trained within a GPU budget.

:class:`Streamer` takes over a model and its optimizer when ``UnifiedMemory`` has a
``gpu_budget``:

* every parameter of 1 MiB or more gets a home in pinned host memory (with homes for its
  gradient and optimizer state); smaller ones, and the buffers, stay on the device;
* inside :meth:`scope` (forward and backward) a ``TorchFunctionMode`` binds a parameter's
  device copy just before any operation uses it, wherever that is (its own module, a tied
  weight read by another, a custom autograd function, a recomputed block), and drops it
  after its last use (:mod:`hpcmem.um.streamed.binding`); saved tensors go through
  :class:`~hpcmem.um.streamed.saved.SavedTensors`;
* a gradient leaves for its home as soon as autograd has accumulated it;
* ``optimizer.step`` steps chunk by chunk (:class:`~hpcmem.um.streamed.optimizer.ChunkedStep`).

Each step is in one :class:`~hpcmem.um.budget.phases.Phase`: the first is the probe
(:mod:`hpcmem.um.streamed.plan`); the second measures the probe's optimizer step and applies
the plan (:class:`~hpcmem.um.streamed.probe.Planner`); from the third on the plan is tuned in
the steady state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from hpcmem.um.budget.floor import check_minimum, describe_floor
from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.host_memory import available_host_bytes
from hpcmem.um.budget.offload import lazy_state_tensors
from hpcmem.um.budget.phases import Phase
from hpcmem.um.budget.recompute import Recompute
from hpcmem.um.budget.transport import Transport, pcie_transfer_ms
from hpcmem.um.streamed.binding import BindParameters, ModuleBinds
from hpcmem.um.streamed.optimizer import ChunkedStep, StateHomes, param_shaped
from hpcmem.um.streamed.params import Counters, Entry, ParamStreams
from hpcmem.um.streamed.plan import StreamPlan, adjust_keep, keep_from, out_cap
from hpcmem.um.streamed.probe import Planner
from hpcmem.um.streamed.saved import SavedTensors
from hpcmem.um.streamed.working import WorkingCopies
from hpcmem.um.tensors import is_tensor, tensor_bytes

__all__ = ["PLAN_AFTER", "RESIDENT_BELOW", "Streamer"]

_log = logging.getLogger(__name__)

#: Parameters smaller than this stay on the device (biases, norms: not worth a copy).
RESIDENT_BELOW = 2**20
#: The step that measures the probe's optimizer step and applies the plan made from it.
PLAN_AFTER = 2


class Streamer:
    """Streams ``model`` and ``optimizer`` through a device budget of ``budget`` bytes.

    ``device_scope()`` routes device allocations to where the budget counts them (the
    activations pool); ``priority`` orders parameters and activations for the room the plan
    has left (a policy's priority); ``recompute`` forces recomputing the repeated blocks on
    or off (None: the plan decides from the probe's measurements); ``state_dtype`` the dtype
    optimizer state keeps in host memory (``Offload.state_dtype``; None: its own);
    ``working_dtype`` that of the copies fp32 parameters are fetched from
    (``Offload.working_dtype``, :mod:`hpcmem.um.streamed.working`; None: the fp32 homes).
    """

    #: Plain (not managed) device memory it holds: none, all it places is in the pool.
    plain_bytes = 0

    def __init__(
        self,
        model: Any,
        optimizer: Any | None,
        *,
        transport: Transport,
        budget: int,
        priority: Sequence[str],
        device_scope: Callable[[], AbstractContextManager[None]],
        recompute: bool | None = None,
        state_dtype: str | None = None,
        working_dtype: str | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self.state_homes = StateHomes(state_dtype)
        self.working = WorkingCopies(working_dtype)
        if transport.device.type == "cuda":
            torch.cuda.empty_cache()  # what earlier jobs left cached is not this job's
        self.transport = transport
        self.budget = budget
        self.priority = tuple(priority)
        self.device_scope = device_scope
        self.counters = Counters()
        self.arena = HostArena(transport)
        self._peaks: list[int] = []  # per step: the job's allocated bytes at most
        self._resident: list[int] = []  # per step and optimizer step: GPU memory held at most
        self._hooks: list[Any] = []
        self._step = 0  # steps begun
        self._phase: Phase | None = None  # of the step begun last
        self._held = 0  # device bytes the set-up copied over (resident data, buffers)
        transport.out_cap = out_cap(budget)
        with torch._C.DisableTorchFunction(), device_scope():
            entries = self._homes(model, optimizer)
            self.params = ParamStreams(entries, transport, self.counters)
            self._buffers_to_device(model)
            self.bandwidth = transport.bandwidth(budget // 8)
            # What else lives on the device (other jobs, caches) is not this job's.
            self._base_bytes = transport.live_bytes() - self._held
        self.saved = SavedTensors(self.params, transport, self.counters)
        self._binds = ModuleBinds(model, self.params)
        self._hooks += self._binds.handles
        self.recompute = Recompute.of(model, transport.live_bytes, around=self._binds.closing)
        if recompute is not False:  # the probe recomputes: the least it can hold
            self.recompute.enable()
        self.chunked = None
        if optimizer is not None:
            self.chunked = ChunkedStep(
                optimizer, self.params, arena=self.arena, transport=transport,
                counters=self.counters, device_scope=device_scope, homes=self.state_homes,
            )
            self.chunked.slice_bytes = out_cap(budget)
        for entry in entries:
            if entry.param.requires_grad and not entry.resident:
                self._hooks.append(entry.param.register_post_accumulate_grad_hook(self._on_grad))
        self._planner = Planner(
            budget=budget, priority=self.priority, params=self.params, saved=self.saved,
            recompute=self.recompute, force_recompute=recompute, chunked=self.chunked,
            optimizer=optimizer, transport=transport, device_scope=device_scope,
        )
        transport.reset_peak()

    @property
    def plan(self) -> StreamPlan | None:
        """The plan in force (None until the probe step is measured)."""
        return self._planner.plan

    # -- set-up -------------------------------------------------------------------------
    def _homes(self, model: Any, optimizer: Any | None) -> list[Entry]:
        unique = {id(p): p for p in model.parameters()}
        entries = []
        for index, param in enumerate(unique.values()):
            nbytes = tensor_bytes(param)
            entries.append(Entry(index, param, nbytes, resident=nbytes < RESIDENT_BELOW))
        states = optimizer.state if optimizer is not None else {}
        streamed = [e for e in entries if not e.resident]
        # state the optimizer makes at its first step has its homes reserved here too: taken
        # later, a chunk at a time, each would round up to a chunk of its own
        lazy = lazy_state_tensors(optimizer) if optimizer is not None else 0
        stepped = {id(p) for group in optimizer.param_groups
                   for p in group["params"]} if optimizer is not None else set()
        homes = sum(
            e.nbytes * (2 if e.param.requires_grad else 1)
            + self.state_homes.home_bytes(e.param, states.get(e.param, {}),
                                          lazy if id(e.param) in stepped else 0)
            for e in streamed
        )
        copies = self.working.fit(streamed, homes, available_host_bytes())
        self.arena.reserve(homes + copies)
        for entry in streamed:
            param = entry.param
            pending, param.grad = param.grad, None  # attached after a backward: kept
            entry.home = self.arena.take(param)
            self.transport.to_host(param.data, entry.home)
            if self.working.applies(entry):
                self.working.make(entry, self.arena)
            state = states.get(param, {})
            for number, (key, value) in enumerate(state.items()):
                if param_shaped(value, entry.param):
                    entry.states[key] = self.arena.take(self.state_homes.like(value))
                    home = self.state_homes.to_home(value, entry, number)
                    self.transport.to_host(home, entry.states[key])
                    state[key] = entry.states[key]
            if param.requires_grad:
                entry.grad_home = self.arena.take(param)
            param.data = entry.home
            if pending is not None:  # the step adds to it (:meth:`_take_pending_grad`)
                entry.grad_home.copy_(pending)
                entry.has_grad, param.grad = True, entry.grad_home
        for entry in entries:
            if entry.resident:
                pending, entry.param.grad = entry.param.grad, None
                entry.device = self._device_copy(entry.param.data)
                entry.param.data = entry.device
                entry.param.grad = None if pending is None else self._device_copy(pending)
            # State left in the state dict (all of a resident's; a streamed one's small
            # tensors, like fused AdamW's step) moves into the budget's pool. State the
            # optimizer keeps on the host (a non-fused AdamW's step) stays there.
            for key, value in states.get(entry.param, {}).items():
                on_device = is_tensor(value) and value.device.type == self.transport.device.type
                if on_device and (entry.resident or not param_shaped(value, entry.param)):
                    states[entry.param][key] = self._device_copy(value)
        return entries

    def _device_copy(self, tensor: Any) -> Any:
        out = self._torch.empty_like(tensor, device=self.transport.device)
        out.copy_(tensor)
        self._held += tensor_bytes(out)
        return out

    def _buffers_to_device(self, model: Any) -> None:
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = self._device_copy(buffer)

    # -- forward and backward --------------------------------------------------------------
    @contextmanager
    def scope(self) -> Iterator[None]:
        """Forward and backward of one step, streamed; after the probe step, a budget below
        what it measured raises :class:`~hpcmem.um.streamed.plan.BudgetTooSmallError`."""
        torch = self._torch
        self._begin()
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack),
                BindParameters(self.params, self.saved),
            ):
                yield
        finally:
            self._end()
        if self._phase is Phase.PROBE and self._planner.probe is not None:
            check_minimum(self.budget, self._planner.probe.peak_bytes, self._floor_detail)

    def _floor_detail(self) -> str:
        """What makes up the probe's floor, and what is off the device already."""
        probe = self._planner.probe
        assert probe is not None
        streamed = [e for e in self.params.entries if not e.resident]
        return describe_floor(
            {"set-up (small parameters, buffers)": probe.held_bytes,
             "the largest parameter streamed in": max(probe.entry_bytes, default=0),
             "the largest saved activation fetched back": probe.largest_saved},
            None, self.recompute,
            {"parameters, gradients and optimizer state on the host":
                 sum(e.state_bytes for e in streamed),
             "saved activations on the host": probe.saved_bytes}, 1)

    def _pack(self, tensor: Any) -> Any:
        with self._torch._C.DisableTorchFunction():
            return self.saved.pack(tensor)

    def _unpack(self, packed: Any) -> Any:
        with self._torch._C.DisableTorchFunction():
            return self.saved.unpack(packed)

    def _on_grad(self, param: Any) -> None:
        """A gradient is complete: send it home now (added to a pending one, if any)."""
        with self._torch._C.DisableTorchFunction():
            entry = self.params.by_param[id(param)]
            if entry.resident:
                return
            grad = param.grad
            if entry.has_grad:  # accumulate: a second backward before the optimizer step,
                # or a parameter used twice (a device change of ``.data`` gives it a new
                # gradient accumulator); added in place, so no third copy is allocated
                earlier, token = self.transport.fetch(entry.grad_home, entry.grad_ready)
                self.transport.wait(token)
                self.counters.h2d += entry.nbytes
                grad.add_(earlier)
                del earlier
            entry.grad_ready = self.transport.offload(grad, entry.grad_home)
            self.counters.d2h += entry.nbytes
            entry.has_grad = True
            param.grad = None

    def _begin(self) -> None:
        planner = self._planner
        self._step += 1
        self._phase = phase = Phase.of(self._step, PLAN_AFTER)
        self._resident.append(self.transport.resident_peak_bytes())  # includes the last step
        if phase is Phase.MEASURE:  # the probe's optimizer step, an entry at a time, measured now
            check_minimum(self.budget, self._resident[-1], self._floor_detail)
            allocated = max(0, self.transport.peak_bytes() - self._base_bytes)
            planner.measure_rounding(allocated, self._resident[-1])
        with self._torch._C.DisableTorchFunction():
            for entry in self.params.entries:
                if not entry.resident:
                    self._take_pending_grad(entry)
            if phase is Phase.MEASURE and planner.probe is not None:
                planner.replan()
            elif phase is Phase.STEADY and planner.plan is not None:
                self.saved.offload_below = keep_from(planner.candidates, planner.keep_bytes)
        self._binds.open.clear()  # a forward that raised last step left its binds open
        self.params.begin_step()
        self.saved.begin_step()
        self.recompute.saved_bytes.clear()
        if phase is Phase.PROBE:
            planner.blocks.start()
        self.transport.reset_peak()

    def _take_pending_grad(self, entry: Entry) -> None:
        """A gradient left in ``param.grad`` is added to by the next backward (accumulation)."""
        grad = entry.param.grad
        if grad is None:
            entry.has_grad = False
            return
        if grad.data_ptr() != entry.grad_home.data_ptr():
            entry.grad_home.copy_(grad)
        entry.has_grad = True
        entry.param.grad = None

    def _end(self) -> None:
        planner = self._planner
        with self._torch._C.DisableTorchFunction():
            self.params.end_step()
            self.saved.end_step()
            self.transport.synchronize()  # gradients are readable at home from here on
            for entry in self.params.entries:
                if entry.has_grad and not entry.resident:
                    entry.param.grad = entry.grad_home
        peak = max(0, self.transport.peak_bytes() - self._base_bytes)
        resident = self.transport.resident_peak_bytes()
        self._peaks.append(peak)
        self.counters.steps += 1
        if self._phase is Phase.PROBE:  # what it held, allocated or cached, whichever is more
            planner.measure_probe(max(peak, resident), peak, self._held)
        elif planner.plan is not None and not self._structure_changed():
            assert planner.probe is not None
            planner.keep_bytes = adjust_keep(
                planner.keep_bytes, peak, resident, self.budget, sum(self.saved.candidates),
                planner.probe, grew=resident > self._resident[-1],
            )
        planner.candidates = list(self.saved.candidates)
        _log.info(
            "step %d: peak %.2f GiB allocated, %.2f GiB resident (budget %.2f GiB); keep %.2f "
            "GiB of %.2f GiB saved; recompute %s; moved %.2f GB in, %.2f GB out so far; "
            "%d fetched on demand", self._step, peak / 2**30, resident / 2**30,
            self.budget / 2**30, planner.keep_bytes / 2**30, sum(self.saved.candidates) / 2**30,
            self.recompute.enabled, self.counters.h2d / 1e9, self.counters.d2h / 1e9,
            self.counters.fetched_on_demand,
        )

    def _structure_changed(self) -> bool:
        # The first step after recomputation was switched saves other tensors: start anew.
        return self._phase is Phase.MEASURE and self.plan is not None and (
            self.plan.recompute != self._planner.probe_recomputed
        )

    def replan(self) -> dict[str, int]:
        """Plan again from the probe and apply it; the bytes given to each use."""
        if self._planner.probe is None:
            return {}
        with self._torch._C.DisableTorchFunction():
            self._planner.replan()
        return self._planner.shares()

    # -- statistics and lifetime ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Bytes moved per step, the measured copy bandwidth, the plan, the peaks."""
        steps = max(1, self.counters.steps)
        h2d, d2h = self.counters.h2d / steps, self.counters.d2h / steps
        return {
            "strategy": "streamed",
            "steps": self.counters.steps,
            "bytes_h2d": int(h2d),
            "bytes_d2h": int(d2h),
            "pcie_bandwidth": dict(self.bandwidth),
            "pcie_transfer_ms": pcie_transfer_ms(h2d, d2h, self.bandwidth),
            "fetched_on_demand": self.counters.fetched_on_demand / steps,
            "peak_allocated_bytes": max(self._peaks, default=0),
            "peak_gpu_resident_bytes": max(
                [*self._resident, self.transport.resident_peak_bytes()], default=0
            ),
            "plan": self.plan.to_record() if self.plan is not None else None,
            "keep_bytes": self._planner.keep_bytes,
            "copy_out_cap": self.transport.out_cap,
            "host_bytes": self.arena.reserved_bytes + self.saved.buffers.reserved_bytes,
            "host_homes_bytes": self.arena.reserved_bytes,
            "host_saved_bytes": self.saved.buffers.reserved_bytes,
            "saved_bytes": sum(self._planner.candidates),
            "state_dtype": self.state_homes.name,
            "working_copies": self.working.name,
        }

    def reset_stats(self) -> None:
        """Counts and peaks from now on (e.g. after warm-up)."""
        self.counters.h2d = self.counters.d2h = self.counters.fetched_on_demand = 0
        self.counters.steps = 0
        self._peaks = []
        self._resident = []
        self.transport.reset_peak()

    def close(self) -> None:
        """Remove hooks and wrappers; parameters stay at home, in host memory."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._planner.blocks.stop()
        self.recompute.disable()
        if self.chunked is not None:
            self.chunked.close()
        self.saved.close()
        self.arena.close()

