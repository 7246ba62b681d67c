"""What the host-optimizer strategy decides from its first step (the probe): the floor, and
which blocks are recomputed from then on."""

from __future__ import annotations

from typing import Any

from hpcmem.um.budget.floor import TARGET_FRACTION, check_minimum
from hpcmem.um.host_optimizer.record import floor_detail
from hpcmem.um.tensors import tensor_bytes

__all__ = ["probe"]


def probe(engine: Any) -> int:
    """The least one step of ``engine`` (a :class:`~hpcmem.um.host_optimizer.HostOptimizer`
    after its first forward and backward) needs on the device: what the step held,
    everything outside the managed pools included, or, where its batch was split, what its
    one-row part held; the working weights at least. A budget below it is refused
    (:class:`~hpcmem.um.budget.floor.BudgetTooSmallError`, naming what makes it up); above
    it, only the blocks whose saved activations the room lacks stay recomputed."""
    transport, base = engine.transport, engine._base_bytes
    working = sum(tensor_bytes(f) for f in engine.flats)
    split = engine.batch_split
    if split is not None and split.floor_bytes is not None:  # the context, not plain memory
        context = max(0, engine.outside_bytes - engine.plain_bytes)
        minimum = max(split.floor_bytes - base + context, working)
    else:
        minimum = max(transport.peak_bytes() - base,
                      transport.resident_peak_bytes() + engine.outside_bytes, working)
    check_minimum(engine.budget, minimum, lambda: floor_detail(engine))
    recompute = engine.recompute
    if engine.offload.recompute is not None or not recompute.enabled:
        return minimum
    if split is None or split.token_bytes is None:
        recompute.keep_within(int(TARGET_FRACTION * engine.budget) - minimum)
    elif (whole := split.whole_bytes()) is not None:  # later batches run whole
        # the rows the split measured first recomputed every block too: only the step's
        # own parts count
        split.add_kept(recompute.keep_within(split.measure.room() - whole, split.parts))
    return minimum
