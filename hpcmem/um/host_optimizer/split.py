"""Which buckets the GPU steps instead of the CPU: planned from one step's measurements.

The budget's room above what a step held buys two placements, each a slot of plain device
memory per bucket for its fp32 gradient, master and optimizer state:

* **a streamed share**: some buckets' master and state come in from their page-locked homes
  ahead of use, through a few shared slots, and go home after the GPU stepped them
  (:mod:`.device_step`). That costs ``4 * states`` bytes more each way per element than the
  CPU's path (master and state instead of the master in and the gradient out), but two
  slots carry as many buckets as PCIe allows: per byte of room, it takes the most work off
  the CPU. Planned when the CPU optimizer took longer than its window (backward, in which
  gradients land and the CPU can step them; the whole compute under the delayed update):
  as much as makes the CPU finish with the window, no more than either PCIe direction can
  carry within it (a share that outlasts it delays the next forward), spread evenly over
  it.
* **resident buckets**, with the room left: a bucket's master and state kept on the device
  for good; nothing of it crosses PCIe or reaches the CPU. The buckets whose gradients were
  completed last are taken first, back from the last as far as the room goes: the CPU
  would step them after backward, while the next forward waits for them (the first layers
  and the input embedding).

A share the job asks for (``HostOptimizerOffload(gpu_share=)``) is kept first, then streamed:
it is then the room alone that limits it. Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["PLAN_AFTER", "ROOM_MARGIN", "SLOTS", "Split", "plan_split", "slot_bytes"]

#: The step after which the split is planned, from the median of the steps since the first
#: (the probe): on the H200 one of them ran up to 35% slower than the rest, and one took
#: 395 ms of CPU optimizer where its neighbours took 211.
PLAN_AFTER = 4

#: Slots a streamed share is planned with: one stepping while the next one's state comes in.
SLOTS = 2
#: Share of the budget left free above what the measured step held.
ROOM_MARGIN = 0.04


@dataclass(frozen=True)
class Split:
    """The plan: the buckets kept on the device, those streamed, through how many slots of
    how many elements, and the share of the trained elements the GPU steps."""

    resident_buckets: tuple[int, ...]
    streamed_buckets: tuple[int, ...]
    slots: int
    slot_numel: int
    share: float
    why: str

    @property
    def gpu_buckets(self) -> tuple[int, ...]:
        """Every bucket the GPU steps: kept, then streamed."""
        return self.resident_buckets + self.streamed_buckets

    def to_record(self) -> dict[str, object]:
        """The plan as a record field."""
        return asdict(self)


def slot_bytes(numel: int, states: int) -> int:
    """Device bytes of one slot of ``numel`` elements: fp32 gradient, master and states."""
    return numel * 4 * (2 + states)


def plan_split(
    *,
    window_ms: float,
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

    ``window_ms`` and ``cpu_ms``: the time a step's CPU optimizer has (its compute from
    the first gradient on; all of it under the delayed update), and the time it took;
    ``bucket_numels``: elements per bucket, in bucket order; ``order``: bucket indices in
    the order their gradients were completed; ``states``: fp32 state tensors per element
    (AdamW 2, SGD with momentum 1); ``bytes_h2d``, ``bytes_d2h``: what the step moved;
    ``bandwidth``: bytes/s each way; ``room_bytes``: device bytes free for the GPU's share;
    ``asked``: the share the job asked for.
    """
    total = sum(bucket_numels)
    if not total:
        return Split((), (), 0, 0, 0.0, "nothing to step")
    pcie = {"window_ms": window_ms, "bytes_h2d": bytes_h2d, "bytes_d2h": bytes_d2h,
            "bandwidth": bandwidth}
    if asked is None and cpu_ms > window_ms:
        wanted = (cpu_ms - window_ms) / cpu_ms * total
        streamed, why = _streamed(bucket_numels, range(len(bucket_numels)), states=states,
                                  room=room_bytes, wanted=wanted, **pcie)
        why = f"CPU optimizer {cpu_ms:.1f} ms over its window {window_ms:.1f} ms: {why}"
        room = room_bytes - SLOTS * slot_bytes(
            max((bucket_numels[i] for i in streamed), default=0), states)
        resident = _resident(bucket_numels, order, set(streamed), states, room, total)
    else:
        goal = total if asked is None else asked * total
        resident = _resident(bucket_numels, order, set(), states, room_bytes, goal)
        kept = sum(bucket_numels[i] for i in resident)
        room = room_bytes - sum(slot_bytes(bucket_numels[i], states) for i in resident)
        streamed, why = [], (f"CPU optimizer {cpu_ms:.1f} ms within its window "
                             f"{window_ms:.1f} ms")
        if asked is not None and goal > kept:
            left = [i for i in range(len(bucket_numels)) if i not in resident]
            streamed, why = _streamed(bucket_numels, left, states=states, room=room,
                                      wanted=goal - kept, **{**pcie, "window_ms": None})
            why = f"asked for {asked:.0%}: {why}"
    moved = sum(bucket_numels[i] for i in [*resident, *streamed])
    kept = sum(bucket_numels[i] for i in resident)
    slot = max((bucket_numels[i] for i in streamed), default=0)
    return Split(tuple(sorted(resident)), tuple(streamed), SLOTS if streamed else 0, slot,
                 moved / total,
                 f"room {room_bytes} bytes; streamed: {why}; kept on the device: "
                 f"{len(resident)} buckets, {kept / total:.0%} of the elements")


def _resident(numels: Sequence[int], order: Sequence[int], taken: set[int], states: int,
              room: int, goal: float) -> list[int]:
    """Buckets to keep on the device: from the last completed back, as far as ``room`` and
    ``goal`` (elements) go, skipping those in ``taken``."""
    chosen, kept = [], 0
    for index in reversed(order):
        if index in taken:
            continue
        numel = numels[index]
        if slot_bytes(numel, states) > room or kept + numel > goal + numel / 2:
            break
        chosen.append(index)
        room -= slot_bytes(numel, states)
        kept += numel
    return chosen


def _streamed(numels: Sequence[int], candidates: Sequence[int], *, states: int, room: int,
              wanted: float, window_ms: float | None, bytes_h2d: float, bytes_d2h: float,
              bandwidth: dict[str, float]) -> tuple[list[int], str]:
    """Buckets among ``candidates`` to stream through the slots, spread evenly over them, up
    to ``wanted`` elements and (with ``window_ms``) what PCIe carries within that window
    beside the step's own bytes; and why that many."""
    total = sum(numels[i] for i in candidates)
    if not total:
        return [], "nothing left"
    share = min(1.0, wanted / total)
    why = f"wanted {share:.0%}"
    if window_ms is not None:
        extra = 4 * states * total  # bytes more each way if every candidate were streamed
        pcie = min(window_ms / 1e3 * bandwidth["h2d"] - bytes_h2d,
                   window_ms / 1e3 * bandwidth["d2h"] - bytes_d2h) / extra
        share = max(0.0, min(share, pcie))
        why += f", PCIe allows {max(0.0, min(pcie, 1.0)):.0%}"
    if share <= 0:
        return [], f"{why}: none"
    chosen, moved = [], 0
    for position, index in enumerate(candidates):  # spread evenly over the window
        numel = numels[index]
        fits = SLOTS * slot_bytes(numel, states) <= room
        if fits and moved + numel <= share * total * (position + 1) / len(candidates) + numel / 2:
            chosen.append(index)
            moved += numel
    if not chosen:
        return [], f"{why}: no bucket's two slots fit the {room} bytes"
    return chosen, f"{why}: {moved / total:.0%} of them"
