"""How the streamed strategy spends a GPU budget, and the PCIe bound of a run: pure arithmetic.

The first step of a job (the probe) runs with the least on the device: every parameter
fetched when an operation needs it and dropped right after, repeated blocks recomputed, every
other saved activation of at least 1 MiB offloaded, copies out capped. Its measured peak
(allocated or held by the allocator, whichever is larger) is what the step cannot do
without: a budget below it is refused
(:func:`hpcmem.um.budget.floor.check_minimum`)
instead of being silently exceeded. :func:`plan_stream` spends only what the budget's
target leaves above it, so a step that follows the plan holds at most the probe's peak plus
what the plan adds:

1. prefetch windows for parameters and for activations in backward, so copies overlap
   compute (each window costs its size plus the largest item it may run over by; no room,
   no window: fetches on demand, as in the probe);
2. recomputation of the repeated blocks (the probe recomputes them, measuring what each
   saves), unless everything fits without it;
3. what is left, in the policy's priority order: parameters kept resident with their
   gradient and optimizer state (smallest first), and saved activations kept on the device
   (the last saved, which backward needs first). The activations share is then tuned each
   step from the measured peak (:func:`adjust_keep`).

The optimizer step runs when no activation is alive: the device bytes the set-up placed
there, the resident parameters' state, two chunks (one stepping, the next arriving) and the
copies out in flight must fit the target.

Everything the plan adds is counted in allocated bytes, but the budget is held in the
caching allocator's segments (2 MiB for allocations up to 1 MiB, 20 MiB for those up to
10 MiB, the size rounded to 2 MiB above): under a budget of tens of MiB one segment is a
tenth of it. The plan therefore spends, besides ``TARGET_FRACTION`` of the budget, only what
is left after the rounding the probe step measured (segments held less bytes allocated at
most, :attr:`Probe.rounding_bytes`) and one more segment of the largest item it adds
(:func:`segment_bytes`), which a new size may open half used; the optimizer step counts one
more chunk for the temporaries of the optimizer's own kernel (a ``foreach`` Adam step makes
one parameter-sized tensor per parameter).

Step 3's shares come from :func:`plan_budget`, which gives the room left to the types in the
policy's priority order.

Numbers are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from hpcmem.um.budget.floor import TARGET_FRACTION

__all__ = [
    "OUT_CAP_SHARE",
    "Probe",
    "StreamPlan",
    "adjust_keep",
    "keep_from",
    "plan_budget",
    "plan_stream",
    "segment_bytes",
    "spendable",
]

#: Largest prefetch window, each.
WINDOW_MAX = 2**30
#: Share of the slack given to each prefetch window.
WINDOW_SHARE = 0.15
#: Optimizer chunks on the device at once (one stepping, the next arriving), and one more
#: for the optimizer's temporaries; what is being written back counts as copies out in flight.
CHUNKS_IN_FLIGHT = 3
#: The caching allocator's segments: allocations up to ``SMALL_SIZE`` share segments of
#: ``SMALL_SEGMENT``; those below ``LARGE_MIN`` share segments of ``LARGE_SEGMENT``; larger
#: ones get a segment of their own size rounded up to ``ROUND_LARGE``.
SMALL_SIZE = 2**20
SMALL_SEGMENT = 2 * 2**20
LARGE_MIN = 10 * 2**20
LARGE_SEGMENT = 20 * 2**20
ROUND_LARGE = 2 * 2**20
#: Share of the budget that may wait for the device-to-host stream (copies out in flight).
OUT_CAP_SHARE = 1 / 16


def segment_bytes(nbytes: int) -> int:
    """The caching allocator's segment for one allocation of ``nbytes``."""
    if nbytes <= SMALL_SIZE:
        return SMALL_SEGMENT
    if nbytes < LARGE_MIN:
        return LARGE_SEGMENT
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


def out_cap(budget: int) -> int:
    """Device bytes that may wait for the device-to-host stream under ``budget``."""
    return max(1, int(budget * OUT_CAP_SHARE))


@dataclass(frozen=True)
class Probe:
    """What the probe step measured."""

    peak_bytes: int  # the job's device bytes at the peak of forward + backward (measured)
    entry_bytes: Sequence[int]  # parameter bytes of each streamed entry
    state_bytes: Sequence[int]  # parameter + gradient + optimizer state bytes of each
    saved_bytes: int  # saved activations offloaded in the step
    largest_saved: int  # the largest of them (one is fetched ahead at least)
    block_saved_bytes: int  # of which saved inside repeated blocks
    block_input_bytes: int  # inputs of the repeated blocks (what recomputing keeps)
    largest_block_saved: int  # the most one block saved (held again while it recomputes)
    recomputed: bool  # whether the probe recomputed the blocks (block bytes are measured)
    held_bytes: int = 0  # device bytes the set-up placed (small parameters, buffers, state)
    allocated_bytes: int | None = None  # allocated at the peak of forward + backward (None: peak)
    rounding_bytes: int = 0  # segments held beyond the bytes allocated at most (measured)

    @property
    def largest_item(self) -> int:
        """The largest tensor the plan may add to the device: a parameter or a saved one."""
        return max(max(self.entry_bytes, default=0), self.largest_saved)

    def reserve(self) -> int:
        """Bytes of the target the plan leaves to the allocator: the measured rounding and
        one segment of the largest item."""
        return self.rounding_bytes + segment_bytes(self.largest_item)


def spendable(budget: int, probe: Probe) -> int:
    """Allocated bytes a planned step may reach: the target less the probe's reserve."""
    return int(budget * TARGET_FRACTION) - probe.reserve()


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


def plan_budget(
    budget: int,
    priority: Sequence[str],
    demand: Mapping[str, int],
    wants_gpu: Mapping[str, bool],
) -> dict[str, int]:
    """GPU bytes per type: each type in ``priority`` order takes ``min(demand, what is left)``.

    Types whose policy does not place them on the GPU get 0. A type with no known demand
    (absent from ``demand``) may take everything that is left.

    >>> plan_budget(10, ["params", "activations", "inputs"],
    ...             {"params": 6, "activations": 8, "inputs": 1},
    ...             {"params": True, "activations": True, "inputs": False})
    {'params': 6, 'activations': 4, 'inputs': 0}
    """
    if budget < 0:
        raise ValueError(f"gpu_budget: {budget} bytes must be >= 0")
    left = budget
    quotas: dict[str, int] = {}
    for type_name in priority:
        if not wants_gpu[type_name]:
            quotas[type_name] = 0
            continue
        need = demand.get(type_name)
        if need is not None and need < 0:
            raise ValueError(f"demand of {type_name}: {need} bytes must be >= 0")
        quota = left if need is None else min(need, left)
        quotas[type_name] = quota
        left -= quota
    return quotas


def plan_stream(budget: int, probe: Probe, priority: Sequence[str]) -> StreamPlan:
    """The plan for ``budget`` bytes given the probe (see the module docstring)."""
    target = spendable(budget, probe)
    allocated = probe.peak_bytes if probe.allocated_bytes is None else probe.allocated_bytes
    slack = max(0, target - allocated)
    share = min(int(slack * WINDOW_SHARE), WINDOW_MAX)
    param_window = _window(share, max(probe.entry_bytes, default=0))
    saved_window = _window(share, probe.largest_saved)
    left = slack - _window_cost(param_window, max(probe.entry_bytes, default=0))
    left -= _window_cost(saved_window, probe.largest_saved)
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
    optimizer_room = target - probe.held_bytes - out_cap(budget)
    resident, used = [], 0
    for index in order:
        cost = probe.state_bytes[index]
        if used + cost > quotas["params"] or used + cost > optimizer_room:
            break
        resident.append(index)
        used += cost
    streamed = [probe.state_bytes[i] for i in range(len(probe.state_bytes)) if i not in resident]
    chunk_room = (optimizer_room - used) // CHUNKS_IN_FLIGHT
    # A parameter whose state does not fit a chunk: one entry at a time, as the probe measured.
    chunk = min(chunk_room, WINDOW_MAX) if max(streamed, default=0) <= chunk_room else 0
    keep = max(0, min(demand["activations"], quotas["activations"] + quotas["params"] - used))
    return StreamPlan(param_window, saved_window, chunk, tuple(sorted(resident)), keep, recompute)


def _window(share: int, largest: int) -> int:
    """A prefetch window in ``share`` bytes: it may run over by one item of ``largest``
    bytes, so the window is what is left after that; 0 (fetch on demand) if nothing is."""
    return share - largest if share > 2 * largest else 0


def _window_cost(window: int, largest: int) -> int:
    return window + largest if window else 0


def _recompute(probe: Probe, room: int) -> bool:
    """Recompute unless everything (activations and parameter state) fits without it.

    Running a block's forward again is an order of magnitude cheaper than fetching what it
    saved back over PCIe (measured on an H200: 1.5 against 14.6 ms per layer of the 0.35B
    transformer, 4.1 against 60 ms per ResNet-50 bottleneck; benchmarks/gpu/primitives.py),
    so blocks that do not fit are recomputed, never offloaded. Blocks that saved nothing
    the probe could measure on the device gain nothing from it.
    """
    if not probe.recomputed or probe.block_saved_bytes <= 0:
        return False
    everything = probe.block_saved_bytes + probe.saved_bytes + sum(probe.state_bytes)
    return everything > room + probe.block_input_bytes + probe.largest_block_saved


def adjust_keep(
    keep_bytes: int, allocated: int, resident: int, budget: int, demand: int, probe: Probe,
    grew: bool = True,
) -> int:
    """Saved-activation bytes to keep next step, moved half way towards the target.

    The step's ``allocated`` peak is held to :func:`spendable`, and its ``resident`` peak
    (segments) to the target less one segment of the largest item, so that growing the
    kept bytes cannot open a segment past the budget. Segments stay cached once made: a
    step whose resident peak did not grow (``grew`` False) gains nothing by keeping less.
    """
    room = min(
        spendable(budget, probe) - allocated,
        int(budget * TARGET_FRACTION) - segment_bytes(probe.largest_item) - resident,
    )
    if room < 0 and not grew:
        room = 0
    return max(0, min(demand, keep_bytes + room // 2))


def keep_from(candidates: Sequence[int], keep_bytes: int) -> int:
    """The first candidate index kept: the last ones saved, up to ``keep_bytes`` together."""
    kept = 0
    index = len(candidates)
    while index > 0 and kept + candidates[index - 1] <= keep_bytes:
        index -= 1
        kept += candidates[index]
    return index
