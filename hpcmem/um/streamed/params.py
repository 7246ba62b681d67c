"""Parameters streamed layer by layer: fetched ahead of use, dropped after their last use.

Each parameter has a home in pinned host memory; while it is in use on the device its
``.data`` is a device copy. The order in which a step uses parameters (forward, recomputed
forward, backward) is recorded; the next step follows it, keeping a window of upcoming
parameters in flight on the copy stream and dropping each copy once the plan says it is not
needed again soon. A parameter is unchanged between optimizer steps, so dropping its device
copy moves nothing back. Accesses the plan did not foresee are fetched on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcmem.um.budget.transport import Transport
from hpcmem.um.streamed.working import fetch_source, widened
from hpcmem.um.tensors import tensor_bytes

__all__ = ["Counters", "Entry", "ParamStreams"]

#: How far ahead in the recorded order an access that left the plan looks for itself.
RESYNC_SEARCH = 64


@dataclass
class Counters:
    """Bytes the mode moved since the last reset."""

    h2d: int = 0
    d2h: int = 0
    fetched_on_demand: int = 0  # parameter fetches the plan did not issue ahead
    steps: int = 0


@dataclass(eq=False)
class Entry:
    """One parameter: its host home, its device copy while fetched, gradient and state homes."""

    index: int
    param: Any
    nbytes: int
    home: Any = None
    resident: bool = False  # its data, gradient and state stay on the device
    device: Any = None  # the device copy while fetched (always, when resident)
    ready: Any = None  # token of the fetch, until compute waited for it
    home_ready: Any = None  # token of the last write into the homes (param and state)
    grad_home: Any = None
    grad_ready: Any = None
    has_grad: bool = False  # grad_home holds this step's gradient
    states: dict[str, Any] = field(default_factory=dict)  # optimizer state homes by key
    working: Any = None  # the narrow copy fetched in place of the home (:mod:`.working`)
    version: int = 0  # the parameter's version counter when ``working`` was last written

    @property
    def state_bytes(self) -> int:
        """Parameter, gradient and optimizer state bytes on the device (the state as wide as
        the parameter, whatever its homes keep): what keeping it resident costs."""
        width = self.param.element_size()
        return self._param_and_grad_bytes + sum(v.numel() * width for v in self.states.values())

    @property
    def home_bytes(self) -> int:
        """Parameter, gradient and optimizer state bytes in their homes: what a step moves."""
        return self._param_and_grad_bytes + sum(map(tensor_bytes, self.states.values()))

    @property
    def working_bytes(self) -> int:
        """Bytes of the working copy (0: none)."""
        return 0 if self.working is None else tensor_bytes(self.working)

    @property
    def fetch_bytes(self) -> int:
        """Bytes a fetch of the parameter copies in."""
        return self.working_bytes or self.nbytes

    @property
    def _param_and_grad_bytes(self) -> int:
        return self.nbytes * (2 if self.param.requires_grad else 1)


class ParamStreams:
    """Fetch, bind and drop device copies of parameters along the recorded order of use."""

    def __init__(self, entries: list[Entry], transport: Transport, counters: Counters) -> None:
        self.entries = entries
        self.by_param = {id(e.param): e for e in entries}
        self.by_pointer = {e.device.data_ptr(): e for e in entries if e.device is not None}
        # Dropped device copies that views may still use: address -> (entry, storage ref).
        self._dropped: dict[int, tuple[Entry, Any]] = {}
        self.transport = transport
        self.counters = counters
        self.window_bytes = 0  # 0: nothing ahead (the probe step)
        self._plan: list[int] = []
        self._next_use: list[int | None] = []
        self._order: list[int] = []
        self._cursor = 0
        self._issued = 0

    # -- device copies ------------------------------------------------------------------
    def fetch(self, entry: Entry) -> None:
        """Start copying ``entry`` to the device (no-op when it is there)."""
        if entry.device is not None:
            return
        source = fetch_source(entry, self.transport)
        entry.device, entry.ready = self.transport.fetch(source, entry.home_ready)
        self.by_pointer[entry.device.data_ptr()] = entry
        self.counters.h2d += entry.fetch_bytes

    def device_copy(self, entry: Entry) -> Any:
        """The device copy, fetched now if needed, ready for the compute stream."""
        if entry.device is None:
            self.counters.fetched_on_demand += 1
            self.fetch(entry)
        if entry.ready is not None:
            self.transport.wait(entry.ready)
            entry.ready = None
        if entry.working is not None and entry.device.dtype == entry.working.dtype:
            self.by_pointer.pop(entry.device.data_ptr(), None)  # widened once, here
            entry.device = widened(entry, entry.device)
            self.by_pointer[entry.device.data_ptr()] = entry
        return entry.device

    def bind(self, entry: Entry) -> None:
        """Make ``param.data`` the device copy (an op is about to use the parameter)."""
        device = self.device_copy(entry)
        if entry.param.data_ptr() != device.data_ptr():
            entry.param.data = device

    def drop(self, entry: Entry) -> None:
        """Forget the device copy; ``param.data`` goes back to the home (nothing copied)."""
        if entry.resident or entry.device is None:
            return
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        if entry.ready is not None:  # never let a block go while a copy may still write it
            self.transport.wait(entry.ready)
            entry.ready = None
        pointer = entry.device.data_ptr()
        self.by_pointer.pop(pointer, None)
        self._dropped[pointer] = (entry, StorageWeakRef(entry.device.untyped_storage()))
        if entry.param.data_ptr() == entry.device.data_ptr():
            entry.param.data = entry.home
        entry.device = None
        # Autocast keeps each parameter's cast for the whole forward: let those go too (a
        # later use casts again; what backward needs, autograd saved).
        torch.clear_autocast_cache()

    def owner(self, pointer: int) -> Entry | None:
        """The parameter whose device copy (current, or dropped but still used by a view)
        starts at ``pointer``."""
        entry = self.by_pointer.get(pointer)
        if entry is not None:
            return entry
        dropped = self._dropped.get(pointer)
        if dropped is None or dropped[1].expired():
            return None
        return dropped[0]

    def make_resident(self, entry: Entry) -> None:
        """Keep the device copy for good, fetched from the home (the caller moves gradient and
        state)."""
        if entry.working is not None:
            self.drop(entry)
            entry.working = None
        self.bind(entry)
        entry.resident = True

    # -- the order of use ---------------------------------------------------------------
    def begin_step(self) -> None:
        """Follow the order the last step recorded (if it recorded one) and record anew."""
        if self._order:
            self._plan = self._order
            self._next_use = _next_uses(self._plan)
        self._order = []
        self._cursor = 0
        self._issued = 0

    def end_step(self) -> None:
        """Drop every device copy that is not resident."""
        for entry in self.entries:
            self.drop(entry)
        self._dropped = {p: d for p, d in self._dropped.items() if not d[1].expired()}

    def access(self, entry: Entry) -> int | None:
        """Record a use of ``entry``, move the prefetch window; its position in the plan."""
        if not self._order or self._order[-1] != entry.index:
            self._order.append(entry.index)
        position = self._locate(entry.index)
        self._prefetch()
        return position

    def after_access(self, entry: Entry, position: int | None) -> None:
        """Drop the device copy unless the plan uses it again inside the window."""
        if entry.resident:
            return
        following = self._next_use[position] if position is not None else None
        if following is None or following >= self._issued:
            self.drop(entry)

    def _locate(self, index: int) -> int | None:
        plan = self._plan
        if 0 < self._cursor <= len(plan) and plan[self._cursor - 1] == index:
            return self._cursor - 1
        for position in range(self._cursor, min(len(plan), self._cursor + RESYNC_SEARCH)):
            if plan[position] == index:
                self._cursor = position + 1
                return position
        return None

    def _prefetch(self) -> None:
        if self.window_bytes <= 0:
            return
        ahead, seen = 0, set()
        position = self._cursor
        while position < len(self._plan):
            entry = self.entries[self._plan[position]]
            if not entry.resident and entry.index not in seen:
                if ahead and ahead + entry.nbytes > self.window_bytes:
                    break
                seen.add(entry.index)
                ahead += entry.nbytes
                self.fetch(entry)
            position += 1
        self._issued = max(self._issued, position)

    def order(self) -> list[int]:
        """The order of use recorded so far in this step (entry indices)."""
        return list(self._order)


def _next_uses(plan: list[int]) -> list[int | None]:
    """For each position, the next position using the same entry (None: none later)."""
    following: list[int | None] = [None] * len(plan)
    last: dict[int, int] = {}
    for position in range(len(plan) - 1, -1, -1):
        following[position] = last.get(plan[position])
        last[plan[position]] = position
    return following
