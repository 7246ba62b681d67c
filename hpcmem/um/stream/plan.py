"""How the streaming mode spends a GPU budget, and the PCIe bound of a run: pure arithmetic.

The first step of a job (the probe) runs with the least on the device: every parameter
fetched when an operation needs it and dropped right after, repeated blocks recomputed, every
other saved activation of at least 1 MiB offloaded. Its peak is what the step cannot do
without. :func:`plan_stream`
spends what the budget leaves above it:

1. prefetch windows for parameters and for activations in backward, so copies overlap
   compute;
2. recomputation of the repeated blocks (the probe recomputes them, measuring what each
   saves), unless everything fits without it;
3. what is left, in the policy's priority order: parameters kept resident with their
   gradient and optimizer state (smallest first), and saved activations kept on the device
   (the last saved, which backward needs first). The activations share is then tuned each
   step from the measured peak (:func:`adjust_keep`).

Numbers are bytes; the budget's target is ``TARGET_FRACTION`` of it, leaving room for the
caching allocator's rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from hpcmem.um.budget import plan_budget

__all__ = [
    "TARGET_FRACTION",
    "Probe",
    "StreamPlan",
    "adjust_keep",
    "keep_from",
    "pcie_transfer_ms",
    "plan_stream",
]

#: Share of the budget the plan fills; the rest absorbs allocator rounding and fragmentation.
TARGET_FRACTION = 0.9
#: Largest prefetch window, each.
WINDOW_MAX = 2**30
#: Share of the slack given to each prefetch window.
WINDOW_SHARE = 0.15
#: Optimizer chunks in flight at once (fetching, stepping, writing back).
CHUNKS_IN_FLIGHT = 3


@dataclass(frozen=True)
class Probe:
    """What the probe step measured."""

    peak_bytes: int  # the job's device bytes at the peak of forward + backward
    entry_bytes: Sequence[int]  # parameter bytes of each streamed entry
    state_bytes: Sequence[int]  # parameter + gradient + optimizer state bytes of each
    saved_bytes: int  # saved activations offloaded in the step
    largest_saved: int  # the largest of them (one is fetched ahead at least)
    block_saved_bytes: int  # of which saved inside repeated blocks
    block_input_bytes: int  # inputs of the repeated blocks (what recomputing keeps)
    largest_block_saved: int  # the most one block saved (held again while it recomputes)
    recomputed: bool  # whether the probe recomputed the blocks (block bytes are measured)


@dataclass(frozen=True)
class StreamPlan:
    """Where the budget goes."""

    param_window: int
    saved_window: int
    chunk_bytes: int
    resident: tuple[int, ...]  # entry indices kept on the device
    keep_bytes: int  # saved activations kept on the device
    recompute: bool

    def to_record(self) -> dict[str, object]:
        """The plan as a record field."""
        record = asdict(self)
        record["resident"] = len(self.resident)
        return record


def plan_stream(budget: int, probe: Probe, priority: Sequence[str]) -> StreamPlan:
    """The plan for ``budget`` bytes given the probe (see the module docstring)."""
    target = int(budget * TARGET_FRACTION)
    largest = max(probe.entry_bytes, default=0)
    slack = max(0, target - probe.peak_bytes)
    param_window = max(largest, min(int(slack * WINDOW_SHARE), WINDOW_MAX))
    saved_window = max(probe.largest_saved, min(int(slack * WINDOW_SHARE), WINDOW_MAX))
    left = slack - param_window - saved_window
    # The probe recomputed (its peak held one block's activations and every block's inputs);
    # not recomputing holds every block's activations at once instead.
    recompute = _recompute(probe, left)
    saved = probe.saved_bytes
    if probe.recomputed and not recompute:
        left += probe.block_input_bytes + probe.largest_block_saved
        saved += probe.block_saved_bytes
    order = sorted(range(len(probe.state_bytes)), key=lambda i: probe.state_bytes[i])
    demand = {"params": sum(probe.state_bytes), "activations": max(0, saved), "inputs": 0}
    wants = {"params": True, "activations": True, "inputs": False}
    quotas = plan_budget(max(0, left), priority, demand, wants)
    resident, used = [], 0
    for index in order:
        if used + probe.state_bytes[index] > quotas["params"]:
            break
        resident.append(index)
        used += probe.state_bytes[index]
    streamed = [probe.state_bytes[i] for i in range(len(probe.state_bytes)) if i not in resident]
    chunk_room = (target - used) // CHUNKS_IN_FLIGHT
    chunk = max(max(streamed, default=0), min(chunk_room, WINDOW_MAX))
    keep = min(demand["activations"], quotas["activations"] + quotas["params"] - used)
    return StreamPlan(param_window, saved_window, chunk, tuple(sorted(resident)), keep, recompute)


def _recompute(probe: Probe, room: int) -> bool:
    """Recompute unless everything (activations and parameter state) fits without it.

    Running a block's forward again is an order of magnitude cheaper than fetching what it
    saved back over PCIe (measured on an H200: 1.5 against 14.6 ms per layer of the 0.35B
    transformer, 4.1 against 60 ms per ResNet-50 bottleneck; benchmarks/gpu/primitives.py),
    so blocks that do not fit are recomputed, never offloaded.
    """
    if not probe.recomputed or probe.block_saved_bytes <= 0:
        return probe.recomputed
    everything = probe.block_saved_bytes + probe.saved_bytes + sum(probe.state_bytes)
    return everything > room + probe.block_input_bytes + probe.largest_block_saved


def adjust_keep(keep_bytes: int, peak_bytes: int, budget: int, demand: int) -> int:
    """Saved-activation bytes to keep next step, moved half way towards the target peak."""
    target = int(budget * TARGET_FRACTION)
    return max(0, min(demand, keep_bytes + (target - peak_bytes) // 2))


def keep_from(candidates: Sequence[int], keep_bytes: int) -> int:
    """The first candidate index kept: the last ones saved, up to ``keep_bytes`` together."""
    kept = 0
    index = len(candidates)
    while index > 0 and kept + candidates[index - 1] <= keep_bytes:
        index -= 1
        kept += candidates[index]
    return index


def pcie_transfer_ms(h2d: float, d2h: float, bandwidth: dict[str, float]) -> float:
    """The least time to move ``h2d`` and ``d2h`` bytes at the measured pinned-copy rates
    (bytes/s: ``h2d`` and ``d2h`` one way, ``both`` each way when both run at once)."""
    both = min(h2d, d2h)
    alone = (h2d - both) / bandwidth["h2d"] + (d2h - both) / bandwidth["d2h"]
    return (both / bandwidth["both"] + alone) * 1e3
