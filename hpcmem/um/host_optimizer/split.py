"""Which buckets the GPU steps instead of the CPU: planned from one step's measurements.

When the CPU optimizer takes longer than the step's compute, the step waits for it. A share
of the buckets can be stepped on the GPU instead: their fp32 master weights and optimizer
state come in from their page-locked homes ahead of use, the optimizer's own CUDA kernel
steps them when their gradients are complete, and master and state go home again
(:mod:`.device_step`). That costs PCIe: ``4 * states`` bytes more each way per element
(master and state instead of the master in and the gradient out) and device memory for the
slots they pass through. The plan shifts as much of the CPU time as makes the CPU finish
with the compute, no more than either PCIe direction can carry within the compute time, in
as many slots as the budget's room above the probe holds (none: everything stays on the
CPU). Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["Split", "plan_split", "slot_bytes"]

#: Slots a share is planned with: one stepping while the next one's state comes in.
SLOTS = 2


@dataclass(frozen=True)
class Split:
    """The plan: the buckets the GPU steps, how many slots of how many elements."""

    device_buckets: tuple[int, ...]
    slots: int
    slot_numel: int
    share: float  # of the trained elements
    why: str

    def to_record(self) -> dict[str, object]:
        """The plan as a record field."""
        return asdict(self)


def slot_bytes(numel: int, states: int) -> int:
    """Device bytes of one slot of ``numel`` elements: fp32 gradient, master and states."""
    return numel * 4 * (2 + states)


def plan_split(
    *,
    compute_ms: float,
    cpu_ms: float,
    bucket_numels: Sequence[int],
    states: int,
    bytes_h2d: float,
    bytes_d2h: float,
    bandwidth: dict[str, float],
    room_bytes: int,
    asked: float | None = None,
) -> Split:
    """The buckets to step on the GPU (see the module docstring).

    ``compute_ms`` and ``cpu_ms``: the last step's compute span and CPU optimizer time;
    ``bucket_numels``: elements per bucket, in bucket order; ``states``: fp32 state tensors
    per element (AdamW 2, SGD with momentum 1); ``bytes_h2d``, ``bytes_d2h``: what the step
    moved; ``bandwidth``: bytes/s each way; ``room_bytes``: device bytes free for slots;
    ``asked``: a share the job asked for (``Offload(gpu_share=)``), then only the room
    limits it.
    """
    total = sum(bucket_numels)
    if asked is not None:
        share, wanted, pcie = asked, asked, 1.0
    else:
        if cpu_ms <= compute_ms or total == 0:
            return Split((), 0, 0, 0.0, f"CPU optimizer {cpu_ms:.1f} ms within compute "
                                        f"{compute_ms:.1f} ms")
        wanted = (cpu_ms - compute_ms) / cpu_ms
        extra = 4 * states * total  # bytes more each way if every element went to the GPU
        pcie = min((compute_ms / 1e3 * bandwidth["h2d"] - bytes_h2d) / extra,
                   (compute_ms / 1e3 * bandwidth["d2h"] - bytes_d2h) / extra) if extra else 1.0
        share = max(0.0, min(wanted, pcie))
    if share <= 0:
        return Split((), 0, 0, 0.0, "PCIe has no room within the compute time")
    if not any(SLOTS * slot_bytes(n, states) <= room_bytes for n in bucket_numels):
        return Split((), 0, 0, 0.0, f"no bucket's slots fit the {room_bytes} bytes of room")
    chosen, moved = [], 0
    for index, numel in enumerate(bucket_numels):  # spread evenly over backward
        fits = SLOTS * slot_bytes(numel, states) <= room_bytes
        if fits and moved + numel <= share * total * (index + 1) / len(bucket_numels) + numel / 2:
            chosen.append(index)
            moved += numel
    if not chosen:
        return Split((), 0, 0, 0.0, "no bucket is small enough for the share")
    slot = max(bucket_numels[i] for i in chosen)
    why = (f"asked for {asked:.0%}" if asked is not None else
           f"CPU optimizer {cpu_ms:.1f} ms over compute {compute_ms:.1f} ms: wanted "
           f"{wanted:.0%}, PCIe allows {min(pcie, 1.0):.0%}")
    return Split(tuple(chosen), SLOTS, slot, moved / total,
                 f"{why}; {moved / total:.0%} of the elements to the GPU")
