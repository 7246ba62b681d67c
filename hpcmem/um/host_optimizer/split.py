"""Which buckets the GPU steps instead of the CPU: planned from one step's measurements.

The budget's room above what a step held buys two things, in this order:

* **resident buckets**: the fp32 master weights and optimizer state of a bucket kept on the
  device for good. The GPU steps it with the optimizer's own CUDA kernel, and nothing of it
  crosses PCIe or reaches the CPU. The buckets whose gradients were completed last are taken
  first: the CPU would step them after backward, while the next forward waits for them (the
  first layers and the input embedding), back from the last as far as the room goes.
* **a streamed share**: when the CPU optimizer still takes longer than the step's compute,
  some other buckets' master and state come in from their page-locked homes ahead of use,
  through a few device slots, and go home after the GPU stepped them (:mod:`.device_step`).
  That costs ``4 * states`` bytes more each way per element than the CPU's path (master and
  state instead of the master in and the gradient out). The plan shifts as much of the CPU
  time as makes the CPU finish with the compute, no more than either PCIe direction can
  carry within the compute time, spread evenly over backward.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["ROOM_MARGIN", "Split", "plan_split", "slot_bytes"]

#: Slots a streamed share is planned with: one stepping while the next one's state comes in.
SLOTS = 2
#: Share of the budget left free above what the measured step held.
ROOM_MARGIN = 0.04


@dataclass(frozen=True)
class Split:
    """The plan: the buckets kept on the device, those streamed, through how many slots of
    how many elements, and the share of the trained elements the GPU steps."""

    resident_buckets: tuple[int, ...]
    device_buckets: tuple[int, ...]
    slots: int
    slot_numel: int
    share: float
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
    order: Sequence[int],
    states: int,
    bytes_h2d: float,
    bytes_d2h: float,
    bandwidth: dict[str, float],
    room_bytes: int,
    asked: float | None = None,
) -> Split:
    """The buckets the GPU steps (see the module docstring).

    ``compute_ms`` and ``cpu_ms``: the last step's compute span and CPU optimizer time;
    ``bucket_numels``: elements per bucket, in bucket order; ``order``: bucket indices in
    the order their gradients were completed; ``states``: fp32 state tensors per element
    (AdamW 2, SGD with momentum 1); ``bytes_h2d``, ``bytes_d2h``: what the step moved;
    ``bandwidth``: bytes/s each way; ``room_bytes``: device bytes free for the GPU's share;
    ``asked``: the share the job asked for (``Offload(gpu_share=)``), then only the room
    limits it.
    """
    total = sum(bucket_numels)
    goal = total if asked is None else asked * total
    resident, room, kept = [], room_bytes, 0
    for index in reversed(order):  # the tail of backward, as far as it fits
        numel = bucket_numels[index]
        if slot_bytes(numel, states) > room or kept + numel > goal + numel / 2:
            break
        resident.append(index)
        room -= slot_bytes(numel, states)
        kept += numel
    rest = [i for i in range(len(bucket_numels)) if i not in resident]
    streamed, why = _streamed(
        [bucket_numels[i] for i in rest], states=states, room=room,
        wanted=None if asked is None else max(0, goal - kept),
        compute_ms=compute_ms, cpu_ms=cpu_ms * (1 - kept / total) if total else 0.0,
        bytes_h2d=bytes_h2d - 4 * kept, bytes_d2h=bytes_d2h - 4 * kept, bandwidth=bandwidth)
    device = tuple(rest[i] for i in streamed)
    moved = kept + sum(bucket_numels[i] for i in device)
    slot = max((bucket_numels[i] for i in device), default=0)
    head = f"asked for {asked:.0%}" if asked is not None else f"room {room_bytes} bytes"
    return Split(tuple(sorted(resident)), device, SLOTS if device else 0, slot,
                 moved / total if total else 0.0,
                 f"{head}: {len(resident)} buckets kept on the device ({kept / max(total, 1):.0%}"
                 f" of the elements); streamed: {why}")


def _streamed(numels: list[int], *, states: int, room: int, wanted: float | None,
              compute_ms: float, cpu_ms: float, bytes_h2d: float, bytes_d2h: float,
              bandwidth: dict[str, float]) -> tuple[list[int], str]:
    """Positions in ``numels`` to stream through the slots, and why that many; ``wanted``:
    elements asked for (None: as many as balance the CPU with the compute)."""
    total = sum(numels)
    if not total:
        return [], "nothing left"
    if wanted is None:
        if cpu_ms <= compute_ms:
            return [], f"the CPU optimizer's {cpu_ms:.1f} ms fit the compute's {compute_ms:.1f}"
        extra = 4 * states * total  # bytes more each way if every element were streamed
        pcie = min(compute_ms / 1e3 * bandwidth["h2d"] - bytes_h2d,
                   compute_ms / 1e3 * bandwidth["d2h"] - bytes_d2h) / extra
        share = max(0.0, min((cpu_ms - compute_ms) / cpu_ms, pcie))
        if share <= 0:
            return [], "PCIe has no room within the compute time"
        why = (f"CPU optimizer {cpu_ms:.1f} ms over compute {compute_ms:.1f} ms, PCIe allows "
               f"{min(pcie, 1.0):.0%}")
    else:
        share, why = min(1.0, wanted / total), "the rest of the share asked for"
    if share <= 0:
        return [], "nothing left to ask for"
    chosen, moved = [], 0
    for position, numel in enumerate(numels):  # spread evenly over backward
        fits = SLOTS * slot_bytes(numel, states) <= room
        if fits and moved + numel <= share * total * (position + 1) / len(numels) + numel / 2:
            chosen.append(position)
            moved += numel
    if not chosen:
        return [], f"no bucket's two slots fit the {room} bytes left"
    return chosen, f"{why}: {moved / total:.0%} of the rest"
