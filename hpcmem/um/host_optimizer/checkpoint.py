"""Checkpoints of a model and optimizer the host optimizer holds, through their own calls.

While attached, a trained parameter holds its working weight (bf16 on the GPU) and the
optimizer holds no state: the fp32 masters and the moments live in the host's buckets. So
that a checkpoint loses nothing however it is taken (``torch.save(model.state_dict())``, HF
``Trainer``'s and Lightning's checkpoints, ``torch.distributed.checkpoint``), the strategy
hooks the calls themselves:

* ``model.state_dict()``: each trained parameter's fp32 master in place of its working
  weight;
* ``optimizer.state_dict()``: each parameter's state (fp32 moments, ``step``) in PyTorch's
  layout, as the optimizer holds it without a budget;
* ``model.load_state_dict(sd)``: the masters (and the weights the native kernel writes)
  from ``sd`` first, then PyTorch's own copy into the working weights;
* ``optimizer.load_state_dict(sd)``: the state into the buckets, the hyperparameters by
  PyTorch's own load; the optimizer keeps no state of its own.

A load is checked whole before anything is written, so a checkpoint of another model is
refused in one line (:class:`~hpcmem.um.errors.BudgetError`, naming the entry and its shape
or count) and leaves the masters and state as they were: a parameter's shape, one missing
or not the model's under ``strict``, the optimizer's param groups and their sizes, a
state's shape.

Both are whole on every rank (a rank's shards gathered; each rank takes its shard back from
a whole one), the state dicts an unbudgeted job writes: a checkpoint resumes on any number
of ranks, or with no budget at all. Each call waits for the host's outstanding steps first
(``settle``; under the delayed update the weights then read next are the updated ones).
Data parallel: every rank calls them together, as with FSDP's full state dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.host import HostBuckets

__all__ = ["Checkpoints"]


class Checkpoints:
    """The four hooks on ``model`` and ``optimizer`` (module docstring); ``settle()`` makes
    the host's masters and state final, ``reload()`` hands loaded ones to the device's own
    copies (the buckets the GPU steps)."""

    def __init__(self, model: Any, optimizer: Any, host: HostBuckets,
                 settle: Callable[[], None], reload: Callable[[], None]) -> None:
        self.host = host
        self.optimizer = optimizer
        self._settle, self._reload = settle, reload
        self._names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(param), []).append(name)
        self._handles = [  # a module's hooks are marked: a function, not a bound method
            model.register_state_dict_post_hook(lambda *args: self._model_saved(*args)),
            model.register_load_state_dict_pre_hook(lambda *args: self._model_loading(*args)),
            optimizer.register_state_dict_post_hook(self._optimizer_saved),
            optimizer.register_load_state_dict_pre_hook(self._optimizer_loading),
        ]

    def remove(self) -> None:
        """Take the hooks off."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _positions(self) -> dict[int, int]:
        """Each parameter's index in the optimizer's state dict (param-group order)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return {id(p): i for i, p in enumerate(params)}

    # -- the model ----------------------------------------------------------------------
    def _model_saved(self, module: Any, state_dict: dict[str, Any], prefix: str,
                     local_metadata: Any) -> None:
        self._settle()
        for index, bucket in enumerate(self.host.buckets):
            master = self.host.whole(index, self.host.masters[index])
            for position, param in enumerate(bucket.params):
                for name in self._names.get(id(param), ()):
                    if prefix + name in state_dict:
                        state_dict[prefix + name] = bucket.slot(master, position)

    def _model_loading(self, module: Any, state_dict: dict[str, Any], prefix: str,
                       local_metadata: Any, strict: bool, *args: Any) -> None:
        if strict:
            _refuse_keys(module, state_dict, prefix)
        loaded = []
        for bucket in self.host.buckets:
            values = []
            for param in bucket.params:
                key = next((prefix + n for n in self._names.get(id(param), ())
                            if prefix + n in state_dict), None)
                value = None if key is None else state_dict[key]
                if value is not None and tuple(value.shape) != tuple(param.shape):
                    raise BudgetError(
                        f"load_state_dict: {key!r} is {tuple(value.shape)} in the checkpoint, "
                        f"not the model's {tuple(param.shape)} (a checkpoint of another "
                        "model?); nothing was loaded")
                values.append(value)
            loaded.append(values)
        self._settle()
        for index, values in enumerate(loaded):
            self.host.load_weights(index, values)
        self._reload()

    # -- the optimizer ------------------------------------------------------------------
    def _optimizer_saved(self, optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._settle()
        positions = self._positions()
        state: dict[int, dict[str, Any]] = {}
        for index, bucket in enumerate(self.host.buckets):
            for position, values in enumerate(self.host.param_states(index)):
                if values:
                    state[positions[id(bucket.params[position])]] = values
        return {**state_dict, "state": dict(sorted(state.items()))}

    def _optimizer_loading(self, optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
        """The state into the buckets; PyTorch's load then takes the param groups only (it
        would make the state on the device, in the working dtype)."""
        groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in groups]
        ours = [len(g["params"]) for g in optimizer.param_groups]
        if sizes != ours:
            raise BudgetError(f"optimizer.load_state_dict: param groups of {sizes} parameters "
                              f"in the checkpoint, not the optimizer's {ours} (a checkpoint of "
                              "another model?); nothing was loaded")
        saved = [i for group in groups for i in group["params"]]
        by_param = {id(p): state_dict["state"].get(i)
                    for p, i in zip((p for g in optimizer.param_groups for p in g["params"]),
                                    saved, strict=True)}
        for param in (p for g in optimizer.param_groups for p in g["params"]):
            for key, value in (by_param[id(param)] or {}).items():
                if getattr(value, "dim", lambda: 0)() and tuple(value.shape) != tuple(
                        param.shape):
                    raise BudgetError(
                        f"optimizer.load_state_dict: state {key!r} is {tuple(value.shape)} in "
                        f"the checkpoint, not its parameter's {tuple(param.shape)} (a "
                        "checkpoint of another model?); nothing was loaded")
        self._settle()
        self.host.take_states(lambda param: by_param.get(id(param)))
        self._reload()
        return {**state_dict, "state": {}}


def _refuse_keys(module: Any, state_dict: dict[str, Any], prefix: str) -> None:
    """Under ``strict``, refuse a state dict that lacks an entry of ``module``'s or has one it
    lacks, as PyTorch's load would, but before anything is written."""
    import torch

    expected = {prefix + name for name, _ in module.named_parameters(remove_duplicate=False)}
    for name, sub in module.named_modules(remove_duplicate=False):
        at = f"{prefix}{name}." if name else prefix
        expected |= {at + b for b, value in sub._buffers.items()
                     if value is not None and b not in sub._non_persistent_buffers_set}
        if type(sub).get_extra_state is not torch.nn.Module.get_extra_state:
            expected.add(at + "_extra_state")
    given = {key for key in state_dict if key.startswith(prefix)}
    missing, extra = expected - given, given - expected
    for keys, what in ((missing, "missing from"), (extra, "not the model's but in")):
        if keys:
            shown = ", ".join(repr(k) for k in sorted(keys)[:3])
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise BudgetError(f"load_state_dict: {shown}{more} {what} the checkpoint (a "
                              "checkpoint of another model?); accepted: the model's own "
                              "entries, or strict=False; nothing was loaded")
