"""The optimizer step over streamed parameters, a chunk at a time, on the device.

``optimizer.step()`` is replaced by: step the resident parameters in place; then, for each
chunk of streamed parameters, fetch parameter, gradient and optimizer state, run the
optimizer's own step on that chunk alone, and write parameter and state back to their homes
(the gradient is spent). The next chunk is fetched while one steps and the last one is
written back. Optimizer state made lazily at the first step gets its home then. Any
optimizer whose update is per parameter works (all of ``torch.optim`` but LBFGS, whose
``step(closure)`` is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hpcmem.um.errors import BudgetError
from hpcmem.um.stream.host import HostArena
from hpcmem.um.stream.params import Counters, Entry, ParamStreams
from hpcmem.um.stream.transport import Transport

__all__ = ["ChunkedStep", "chunks"]


@dataclass
class _Loaded:
    """One entry's device copies during its chunk's step."""

    entry: Entry
    param: Any
    grad: Any
    states: dict[str, Any]
    tokens: list[Any]


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
    ) -> None:
        self.optimizer = optimizer
        self.params = params
        self.arena = arena
        self.transport = transport
        self.counters = counters
        self.device_scope = device_scope
        self.chunk_bytes = 0  # set by the plan; 0: one entry at a time
        self._had_own_step = "step" in optimizer.__dict__
        self._previous = optimizer.__dict__.get("step")
        self._original = optimizer.step
        self._wrapper = self.step
        optimizer.step = self._wrapper

    def step(self, closure: Any = None) -> None:
        """Step every parameter: resident ones in place, streamed ones chunk by chunk."""
        if closure is not None:
            raise BudgetError(
                "gpu_budget: optimizer.step(closure) is not supported (the budget mode steps "
                "parameters a chunk at a time; use an optimizer that needs no closure)"
            )
        import torch

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
            self._stream(chunks(streamed, self.chunk_bytes))

    def _stream(self, groups: list[list[Entry]]) -> None:
        loaded = self._fetch(groups[0]) if groups else []
        for index in range(len(groups)):
            upcoming = self._fetch(groups[index + 1]) if index + 1 < len(groups) else []
            self._activate(loaded)
            self._step_only({id(item.entry.param) for item in loaded})
            self._write_back(loaded)
            loaded = upcoming

    def _step_only(self, keep: set[int]) -> None:
        groups = self.optimizer.param_groups
        everything = [group["params"] for group in groups]
        try:
            for group, members in zip(groups, everything, strict=True):
                group["params"] = [p for p in members if id(p) in keep]
            self._original()
        finally:
            for group, members in zip(groups, everything, strict=True):
                group["params"] = members

    def _fetch(self, group: list[Entry]) -> list[_Loaded]:
        fetch = self.transport.fetch
        loaded = []
        for entry in group:
            param, param_token = fetch(entry.home, entry.home_ready)
            grad, grad_token = fetch(entry.grad_home, entry.grad_ready)
            states, tokens = {}, [param_token, grad_token]
            for key, home in entry.states.items():
                states[key], token = fetch(home, entry.home_ready)
                tokens.append(token)
            self.counters.h2d += entry.state_bytes
            loaded.append(_Loaded(entry, param, grad, states, tokens))
        return loaded

    def _activate(self, loaded: list[_Loaded]) -> None:
        for item in loaded:
            for token in item.tokens:
                if token is not None:
                    self.transport.wait(token)
            param = item.entry.param
            param.data = item.param
            param.grad = item.grad
            state = self.optimizer.state[param]
            for key, value in item.states.items():
                state[key] = value

    def _write_back(self, loaded: list[_Loaded]) -> None:
        offload = self.transport.offload
        for item in loaded:
            entry, param = item.entry, item.entry.param
            state = self.optimizer.state[param]
            for key, value in state.items():
                if key not in entry.states and _param_shaped(value, param):
                    entry.states[key] = self.arena.take(value)  # made by this first step
            token = offload(param.data, entry.home)
            for key, home in entry.states.items():
                token = offload(state[key], home)
                state[key] = home
            entry.home_ready = token
            self.counters.d2h += entry.state_bytes - entry.nbytes  # the gradient stays
            param.grad = None
            param.data = entry.home
            entry.has_grad = False

    def close(self) -> None:
        """Give the optimizer its own ``step`` back."""
        if self.optimizer.__dict__.get("step") is self._wrapper:
            if self._had_own_step:
                self.optimizer.step = self._previous
            else:
                del self.optimizer.step


def _param_shaped(value: Any, param: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.shape == param.shape and value.numel() > 1
