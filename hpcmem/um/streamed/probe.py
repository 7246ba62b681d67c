"""The probe step measured, and the plan made from it put in force.

The first step of a job is the probe (:mod:`hpcmem.um.streamed.plan`): :class:`Planner`
records what it measured (its peaks, what the repeated blocks saved and were called with,
and, after its optimizer step, the allocator's rounding); before the second step it makes
the plan from that and applies it: prefetch windows, optimizer chunks, recomputation on or
off, the saved activations kept on the device, the parameters made resident with their
gradient and optimizer state. :class:`~hpcmem.um.streamed.engine.Streamer` runs the steps and
tunes the activations kept after each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from hpcmem.um.budget.recompute import Recompute
from hpcmem.um.budget.transport import Transport
from hpcmem.um.streamed.optimizer import ChunkedStep
from hpcmem.um.streamed.params import Entry, ParamStreams
from hpcmem.um.streamed.plan import Probe, StreamPlan, keep_from, plan_stream
from hpcmem.um.streamed.saved import SavedTensors
from hpcmem.um.tensors import is_tensor, tensor_bytes

__all__ = ["Planner"]


class Planner:
    """The probe's measurements and the plan in force for ``budget`` bytes.

    ``force_recompute`` forces recomputing the repeated blocks on or off in the plan (None:
    the plan decides). ``keep_bytes`` (the saved activations kept) and ``candidates`` (the
    sizes of the last step's offload candidates) are tuned by the streamer step by step.
    """

    def __init__(
        self,
        *,
        budget: int,
        priority: Sequence[str],
        params: ParamStreams,
        saved: SavedTensors,
        recompute: Recompute,
        force_recompute: bool | None,
        chunked: ChunkedStep | None,
        optimizer: Any | None,
        transport: Transport,
        device_scope: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self.budget = budget
        self.priority = priority
        self.params = params
        self.saved = saved
        self.recompute = recompute
        self.chunked = chunked
        self.transport = transport
        self.device_scope = device_scope
        self.plan: StreamPlan | None = None
        self.probe: Probe | None = None
        self.keep_bytes = 0
        self.candidates: list[int] = []
        self.probe_recomputed = False  # whether the probe step recomputed (measured)
        self.blocks = _BlockProbe(recompute.blocks)
        self._optimizer = optimizer
        self._force_recompute = force_recompute

    def measure_rounding(self, allocated: int, resident: int) -> None:
        """After the probe's optimizer step: the segments held (``resident``) beyond the
        most bytes the whole probe step ``allocated`` (the allocator's rounding and
        fragmentation)."""
        if self.probe is None:
            return
        rounding = max(0, resident - allocated)
        self.probe = replace(self.probe, rounding_bytes=rounding)

    def measure_probe(self, peak: int, allocated: int, held: int) -> None:
        """The probe step's measurements: its ``peak`` (allocated or held, whichever is
        more), its ``allocated`` peak, and the device bytes the set-up ``held``."""
        self.probe_recomputed = self.recompute.enabled
        recomputed = self.recompute.saved_bytes
        self.probe = Probe(
            peak_bytes=peak,
            allocated_bytes=allocated,
            entry_bytes=[e.nbytes for e in self.params.entries],
            state_bytes=[e.state_bytes for e in self.params.entries],
            saved_bytes=sum(self.saved.candidates),
            largest_saved=max(self.saved.candidates, default=0),
            block_saved_bytes=sum(recomputed),
            block_input_bytes=self.blocks.stop().input_bytes,
            largest_block_saved=max(recomputed, default=0),
            recomputed=self.recompute.enabled,
            held_bytes=held,
        )

    def replan(self) -> None:
        """Plan again from the probe, with optimizer state as it is now, and apply it."""
        self._apply(self._plan())

    def shares(self) -> dict[str, int]:
        """The bytes the plan in force gives to each use."""
        assert self.plan is not None
        return {
            "param_window": self.plan.param_window,
            "saved_window": self.plan.saved_window,
            "resident": sum(self.params.entries[i].state_bytes for i in self.plan.resident),
            "keep": self.plan.keep_bytes,
        }

    def _plan(self) -> StreamPlan:
        """The plan from the probe, with optimizer state as it is now (made at the first
        step, after the probe measured)."""
        assert self.probe is not None
        probe = replace(self.probe, state_bytes=[e.state_bytes for e in self.params.entries])
        plan = plan_stream(self.budget, probe, self.priority)
        if self._force_recompute is not None:
            plan = replace(plan, recompute=self._force_recompute)
        return plan

    def _apply(self, plan: StreamPlan) -> None:
        """Put a plan in force for the coming step."""
        self.plan = plan
        self.params.window_bytes = plan.param_window
        self.saved.window_bytes = plan.saved_window
        if self.chunked is not None:
            self.chunked.chunk_bytes = plan.chunk_bytes
        if plan.recompute:
            self.recompute.enable()
        else:
            self.recompute.disable()
        if plan.recompute == self.probe_recomputed:
            self.saved.offload_below = keep_from(self.candidates, plan.keep_bytes)
        else:
            self.saved.offload_below = None  # other tensors are saved now: measure again
        self.keep_bytes = plan.keep_bytes
        with self.device_scope():
            for index in plan.resident:
                self._make_resident(self.params.entries[index])

    def _make_resident(self, entry: Entry) -> None:
        if entry.resident:
            return
        self.params.make_resident(entry)
        fetch = self.transport.fetch
        if entry.has_grad:
            entry.param.grad, token = fetch(entry.grad_home, entry.grad_ready)
            self.transport.wait(token)
            entry.has_grad = False
        if self._optimizer is not None:
            state = self._optimizer.state[entry.param]
            for key, home in entry.states.items():
                value, token = fetch(home, entry.home_ready)
                self.transport.wait(token)
                state[key] = self.chunked.homes.widened(value, entry.param)
        entry.states = {}


class _BlockProbe:
    """During the probe: the bytes of the inputs the repeated blocks were called with (what
    recomputing them keeps through forward)."""

    def __init__(self, blocks: list[Any]) -> None:
        self._blocks = blocks
        self._handles: list[Any] = []
        self.input_bytes = 0

    def start(self) -> None:
        self._handles = [block.register_forward_pre_hook(self._before) for block in self._blocks]

    def _before(self, module: Any, args: Any) -> None:
        self.input_bytes += sum(tensor_bytes(a) for a in args if is_tensor(a))

    def stop(self) -> _BlockProbe:
        """Remove the hooks; the measurement is final."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return self
