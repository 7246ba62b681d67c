"""The optimizer step over streamed parameters, a chunk at a time, on the device.

``optimizer.step()`` is replaced by: step the resident parameters in place; then, for each
chunk of streamed parameters, fetch parameter, gradient and optimizer state, run the
optimizer's own step on that chunk alone, and write parameter and state back to their homes
(the gradient is spent). The next chunk is fetched while one steps and the last one is
written back. Optimizer state made lazily at the first step gets its home then. Any
optimizer whose update is per parameter works (all of ``torch.optim`` but LBFGS, which
evaluates its closure several times a step and is refused); a closure runs once, first.

A parameter whose state is larger than a chunk (a tied embedding, under a small budget) is
stepped in slices of rows when the optimizer's update is elementwise (``SLICEABLE``): each
slice is given to the optimizer as a parameter of its own, with the slices of its state
and a copy of its scalar state (Adam's ``step``), so the result is the same, element for
element, as stepping it whole.

With a narrow ``state_dtype`` (``Offload.state_dtype``) the state's homes keep it in that
dtype: a chunk's state is widened to the parameter's dtype on the device for the step, and
rounded stochastically on its way back home (:func:`~hpcmem.um.tensors.round_stochastic`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.transport import Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.streamed.params import Counters, Entry, ParamStreams
from hpcmem.um.streamed.working import write_working
from hpcmem.um.tensors import is_tensor, round_stochastic, tensor_bytes

__all__ = ["SLICEABLE", "ChunkedStep", "StateHomes", "chunks", "param_shaped", "row_slices"]

#: Optimizers (``torch.optim`` class names) whose update is elementwise: a slice of rows
#: steps exactly as it would inside the whole parameter.
SLICEABLE = ("SGD", "Adam", "AdamW")


@dataclass
class _Loaded:
    """One entry's (or a slice of its rows') device copies during its chunk's step."""

    entry: Entry
    param: Any
    grad: Any
    states: dict[str, Any]
    tokens: list[Any]
    rows: slice | None = None  # None: the whole parameter
    last: bool = True  # the last slice of its entry
    stand_in: Any = None  # the parameter the optimizer steps for a slice


def row_slices(entry: Entry, limit: int) -> list[slice | None]:
    """Row ranges of at most ``limit`` bytes of state each ([None]: the whole entry)."""
    rows = entry.param.shape[0] if entry.param.dim() > 1 else 0
    pieces = min(rows, -(-entry.state_bytes // max(1, limit)))
    if pieces < 2:
        return [None]
    step = -(-rows // pieces)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


class StateHomes:
    """How fp32 optimizer state keeps in its homes: in ``state_dtype`` (``Offload.state_dtype``;
    None or ``float32``: as it is); state of any other dtype keeps its own."""

    def __init__(self, state_dtype: str | None = None) -> None:
        import torch

        self.name = state_dtype or "float32"
        self.narrow = None if self.name == "float32" else getattr(torch, self.name)
        self.steps = 0  # seeds the rounding: each step's differs

    def _narrows(self, value: Any) -> bool:
        import torch

        return self.narrow is not None and value.dtype == torch.float32

    def like(self, value: Any) -> Any:
        """A shape-only stand-in for ``value``'s home (what ``HostArena.take`` reads)."""
        if not self._narrows(value):
            return value
        import torch

        return torch.empty(value.shape, dtype=self.narrow, device="meta")

    def home_bytes(self, param: Any, state: dict[str, Any], made_later: int) -> int:
        """Host bytes of ``param``'s optimizer state in its homes: the parameter-shaped
        tensors of ``state``, or, before the optimizer made any, ``made_later`` of them
        (:func:`~hpcmem.um.budget.offload.lazy_state_tensors`)."""
        if state:
            return sum(tensor_bytes(self.like(v)) for v in state.values()
                       if param_shaped(v, param))
        return made_later * tensor_bytes(self.like(param))

    def to_home(self, value: Any, entry: Entry, number: int, start: int = 0) -> Any:
        """``value``, the ``number``-th state of ``entry`` from row ``start`` on, as its home
        keeps it: rounded from noise seeded by the step, the entry, the state and the row."""
        if not self._narrows(value):
            return value
        seed = ((self.steps * 1_000_003 + entry.index) * 8 + number) * 1_000_003 + start
        return round_stochastic(value, self.narrow, seed)

    def widened(self, value: Any, like: Any) -> Any:
        """``value`` (from a home) as wide as ``like`` (its parameter) for the step."""
        if self.narrow is None or value.dtype != self.narrow or not self._narrows(like):
            return value
        return value.to(like.dtype)


def chunks(entries: list[Entry], chunk_bytes: int) -> list[list[Entry]]:
    """Consecutive groups of entries, each at most ``chunk_bytes`` of state (or one entry)."""
    groups: list[list[Entry]] = []
    size = 0
    for entry in entries:
        cost = entry.state_bytes
        if not groups or (size + cost > chunk_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += cost
    return groups


class ChunkedStep:
    """Replaces ``optimizer.step`` for the life of the job (see the module docstring)."""

    def __init__(
        self,
        optimizer: Any,
        params: ParamStreams,
        *,
        arena: HostArena,
        transport: Transport,
        counters: Counters,
        device_scope: Callable[[], AbstractContextManager[None]],
        homes: StateHomes | None = None,
    ) -> None:
        import torch

        if isinstance(optimizer, torch.optim.LBFGS):
            raise BudgetError(
                "gpu_budget: LBFGS is not supported (it evaluates its closure several times a "
                "step; the budget mode steps parameters a chunk at a time, once)"
            )
        self.optimizer = optimizer
        self.params = params
        self.arena = arena
        self.transport = transport
        self.counters = counters
        self.device_scope = device_scope
        self.homes = homes or StateHomes()
        self.chunk_bytes = 0  # set by the plan; 0: one entry at a time
        self.slice_bytes = 0  # state bytes above which an entry steps in slices (0: never)
        self._sliceable = _elementwise(optimizer)
        self._had_own_step = "step" in optimizer.__dict__
        self._previous = optimizer.__dict__.get("step")
        self._original = optimizer.step
        self._wrapper = self.step
        optimizer.step = self._wrapper

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step every parameter: resident ones in place, streamed ones chunk by chunk.

        ``closure`` (torch.optim's: a forward and backward, returning the loss) runs first,
        once; its loss is returned.
        """
        import torch

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch._C.DisableTorchFunction(), self.device_scope():
            members = [p for group in self.optimizer.param_groups for p in group["params"]]
            streamed = []
            in_place = set()
            for param in members:
                entry = self.params.by_param.get(id(param))
                if entry is not None and not entry.resident:
                    if entry.has_grad:
                        streamed.append(entry)
                else:
                    in_place.add(id(param))
            if in_place:
                self._step_only(in_place)
            self._stream(self._units(chunks(streamed, self.chunk_bytes)))
        self.homes.steps += 1
        return loss

    def _units(self, groups: list[list[Entry]]) -> list[list[tuple[Entry, slice | None]]]:
        """Each group as (entry, rows) units; an entry larger than the limit alone, sliced."""
        limit = max(self.chunk_bytes, self.slice_bytes)
        units: list[list[tuple[Entry, slice | None]]] = []
        for group in groups:
            entry = group[0]
            large = len(group) == 1 and entry.states and entry.state_bytes > limit
            if self._sliceable and self.slice_bytes and large:
                units += [[(entry, rows)] for rows in row_slices(entry, limit)]
            else:
                units.append([(member, None) for member in group])
        return units

    def _stream(self, groups: list[list[tuple[Entry, slice | None]]]) -> None:
        loaded = self._fetch(groups[0]) if groups else []
        for index in range(len(groups)):
            upcoming = self._fetch(groups[index + 1]) if index + 1 < len(groups) else []
            self._activate(loaded)
            self._step_only(
                {id(item.entry.param) for item in loaded},
                {id(item.entry.param): item.stand_in for item in loaded if item.rows},
            )
            self._write_back(loaded)
            loaded = upcoming

    def _step_only(self, keep: set[int], stand_ins: dict[int, Any] | None = None) -> None:
        stand_ins = stand_ins or {}
        groups = self.optimizer.param_groups
        everything = [group["params"] for group in groups]
        try:
            for group, members in zip(groups, everything, strict=True):
                group["params"] = [stand_ins.get(id(p), p) for p in members if id(p) in keep]
            self._original()
        finally:
            for group, members in zip(groups, everything, strict=True):
                group["params"] = members

    def _fetch(self, group: list[tuple[Entry, slice | None]]) -> list[_Loaded]:
        fetch = self.transport.fetch
        loaded = []
        for entry, rows in group:
            param, param_token = fetch(_rows(entry.home, rows), entry.home_ready)
            grad, grad_token = fetch(_rows(entry.grad_home, rows), entry.grad_ready)
            states, tokens = {}, [param_token, grad_token]
            for key, home in entry.states.items():
                states[key], token = fetch(_rows(home, rows), entry.home_ready)
                tokens.append(token)
            share = 1.0 if rows is None else (rows.stop - rows.start) / entry.param.shape[0]
            self.counters.h2d += int(entry.home_bytes * share)
            last = rows is None or rows.stop == entry.param.shape[0]
            loaded.append(_Loaded(entry, param, grad, states, tokens, rows, last))
        return loaded

    def _activate(self, loaded: list[_Loaded]) -> None:
        for item in loaded:
            for token in item.tokens:
                if token is not None:
                    self.transport.wait(token)
            param = item.entry.param
            item.states = {key: self.homes.widened(value, item.param)
                           for key, value in item.states.items()}
            if item.rows is not None:
                self._stand_in(item)
                continue
            param.data = item.param
            param.grad = item.grad
            state = self.optimizer.state[param]
            for key, value in item.states.items():
                state[key] = value

    def _stand_in(self, item: _Loaded) -> None:
        """A parameter of the slice's rows, with its state: the slices of the state, a copy
        of the scalar state."""
        import torch

        stand_in = torch.nn.Parameter(item.param, requires_grad=item.entry.param.requires_grad)
        stand_in.grad = item.grad
        state = {
            key: value.clone() if isinstance(value, torch.Tensor) else value
            for key, value in self.optimizer.state[item.entry.param].items()
            if key not in item.entry.states
        }
        state.update(item.states)
        self.optimizer.state[stand_in] = state
        item.stand_in = stand_in

    def _write_back(self, loaded: list[_Loaded]) -> None:
        offload = self.transport.offload
        for item in loaded:
            if item.rows is not None:
                self._write_back_rows(item)
                continue
            entry, param = item.entry, item.entry.param
            state = self.optimizer.state[param]
            for key, value in state.items():
                if key not in entry.states and param_shaped(value, param):
                    entry.states[key] = self.arena.take(self.homes.like(value))  # made now
            token = offload(param.data, entry.home)
            token = write_working(entry, param.data, self.transport) or token
            for number, (key, home) in enumerate(entry.states.items()):
                token = offload(self.homes.to_home(state[key], entry, number), home)
                state[key] = home
            entry.home_ready, entry.version = token, param._version
            # the gradient stays
            self.counters.d2h += entry.home_bytes - entry.nbytes + entry.working_bytes
            param.grad = None
            param.data = entry.home
            entry.has_grad = False

    def _write_back_rows(self, item: _Loaded) -> None:
        entry, rows = item.entry, item.rows
        state = self.optimizer.state.pop(item.stand_in)
        token = self.transport.offload(item.stand_in.data, entry.home[rows])
        token = write_working(entry, item.stand_in.data, self.transport, rows) or token
        for number, (key, home) in enumerate(entry.states.items()):
            home_rows = self.homes.to_home(state[key], entry, number, rows.start)
            token = self.transport.offload(home_rows, home[rows])
        entry.home_ready = token
        share = (rows.stop - rows.start) / entry.param.shape[0]
        self.counters.d2h += int((entry.home_bytes - entry.nbytes + entry.working_bytes) * share)
        item.stand_in.grad = None
        if item.last:  # every slice took the same scalar state forward: keep the last one's
            own = self.optimizer.state[entry.param]
            for key, value in state.items():
                if key not in entry.states:
                    own[key] = value
            entry.param.grad = None
            entry.has_grad = False

    def close(self) -> None:
        """Give the optimizer its own ``step`` back, and state as wide as its parameters."""
        if self.homes.narrow is not None:
            for entry in self.params.entries:
                state = self.optimizer.state.get(entry.param, {})
                for key, home in entry.states.items():
                    state[key] = self.homes.widened(home, entry.param)
        if self.optimizer.__dict__.get("step") is self._wrapper:
            if self._had_own_step:
                self.optimizer.step = self._previous
            else:
                del self.optimizer.step


def _rows(home: Any, rows: slice | None) -> Any:
    return home if rows is None else home[rows]


def _elementwise(optimizer: Any) -> bool:
    import torch

    return any(type(optimizer) is getattr(torch.optim, name) for name in SLICEABLE)


def param_shaped(value: Any, param: Any) -> bool:
    """Whether the optimizer state ``value`` has one element per element of ``param`` (a
    moment, not a step count): such state keeps a home beside the parameter's."""
    return is_tensor(value) and value.shape == param.shape and value.numel() > 1
