"""Binding streamed parameters to the operations and modules that use them.

Inside :meth:`~hpcmem.um.streamed.engine.Streamer.scope` (forward and backward) a parameter's
``.data`` is its device copy only around its uses: :class:`BindParameters`, a
``TorchFunctionMode``, binds the streamed parameters an operation is given just before it
runs and lets :class:`~hpcmem.um.streamed.params.ParamStreams` drop them after, wherever the
operation is (its own module, a tied weight read by another, a recomputed block);
:class:`ModuleBinds` also binds each module's own streamed parameters for its forward, for
what reads a parameter without an operation first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.overrides import TorchFunctionMode

from hpcmem.um.streamed.params import Entry, ParamStreams
from hpcmem.um.streamed.saved import SavedTensors

__all__ = ["BindParameters", "ModuleBinds"]


class BindParameters(TorchFunctionMode):
    """Binds streamed parameters around each operation that uses them."""

    def __init__(self, params: ParamStreams, saved: SavedTensors) -> None:
        super().__init__()
        self._params = params
        self._saved = saved

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._saved.new_operation()
        used = _streamed_in(itertools.chain(args, kwargs.values()), self._params)
        if not used:
            return func(*args, **kwargs)
        positions = [(entry, self._params.access(entry)) for entry in used]
        for entry, _ in positions:
            self._params.bind(entry)
        try:
            return func(*args, **kwargs)
        finally:
            for entry, position in positions:
                self._params.after_access(entry, position)


def _streamed_in(values: Any, params: ParamStreams) -> list[Entry]:
    """Streamed (not resident) parameters among ``values`` and the lists in them."""
    from torch.nn import Parameter

    found: list[Entry] = []
    for value in values:
        candidates = value if isinstance(value, list | tuple) else (value,)
        for item in candidates:
            if isinstance(item, Parameter):
                entry = params.by_param.get(id(item))
                if entry is not None and not entry.resident and entry not in found:
                    found.append(entry)
    return found


class ModuleBinds:
    """Hooks binding each module's own streamed parameters for its forward.

    Operations bind what they use anyway; this also covers what reads a parameter without
    an operation first, such as a custom autograd function given it as an input (autograd
    records the input's device when the function is applied). Modules nest, so the binds
    open at a time form a stack; a forward that raises (a recomputation stops with an
    exception once it has what backward needs) skips its module's closing hook, and
    :meth:`closing` drops what such a forward left bound.
    """

    def __init__(self, model: Any, params: ParamStreams) -> None:
        self._params = params
        self.open: list[list[tuple[Entry, int | None]]] = []
        self.handles: list[Any] = []
        for module in model.modules():
            own = [params.by_param[id(p)] for p in module.parameters(recurse=False)]
            own = [e for e in own if not e.resident]
            if own:
                self.handles.append(module.register_forward_pre_hook(self._before(own)))
                self.handles.append(module.register_forward_hook(self._after))

    def _before(self, own: list[Entry]) -> Callable[[Any, Any], None]:
        def before(module: Any, args: Any) -> None:
            import torch

            with torch._C.DisableTorchFunction():
                positions = [(entry, self._params.access(entry)) for entry in own]
                for entry, _ in positions:
                    self._params.bind(entry)
            self.open.append(positions)

        return before

    def _after(self, module: Any, args: Any, output: Any) -> None:
        if self.open:
            self._close(self.open.pop())

    def _close(self, positions: list[tuple[Entry, int | None]]) -> None:
        import torch

        with torch._C.DisableTorchFunction():
            for entry, position in positions:
                self._params.after_access(entry, position)

    @contextmanager
    def closing(self) -> Iterator[None]:
        """Whatever the forward inside leaves bound is released when it ends, raised or not."""
        depth = len(self.open)
        try:
            yield
        finally:
            while len(self.open) > depth:
                self._close(self.open.pop())
