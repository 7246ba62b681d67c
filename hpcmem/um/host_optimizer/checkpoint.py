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

Both are whole on every rank (a rank's shards gathered; each rank takes its shard back from
a whole one), the state dicts an unbudgeted job writes: a checkpoint resumes on any number
of ranks, or with no budget at all. Each call waits for the host's outstanding steps first
(``settle``; under the delayed update the weights then read next are the updated ones).
Data parallel: every rank calls them together, as with FSDP's full state dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
                       *args: Any) -> None:
        self._settle()
        for index, bucket in enumerate(self.host.buckets):
            values = [next((state_dict[prefix + n] for n in self._names.get(id(p), ())
                            if prefix + n in state_dict), None) for p in bucket.params]
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
        self._settle()
        saved = [i for group in state_dict["param_groups"] for i in group["params"]]
        by_param = {id(p): state_dict["state"].get(i)
                    for p, i in zip((p for g in optimizer.param_groups for p in g["params"]),
                                    saved, strict=False)}
        self.host.take_states(lambda param: by_param.get(id(param)))
        self._reload()
        return {**state_dict, "state": {}}
