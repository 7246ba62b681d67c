"""The chunked loss (:mod:`hpcmem.um.budget.chunked_loss`) installed on a Hugging Face causal LM.

At ``attach`` under a budget, a model that looks like one (``lm_head`` a ``torch.nn.Linear``,
a base model behind ``get_decoder()`` or ``base_model``, ``config.vocab_size`` its width,
a forward that takes ``labels`` and a ``loss_function``), or the one such module inside the
model attached (a LightningModule's), gets three instance attributes, none of its code
changed:

* ``model.forward``: given ``labels``, runs the model's own forward with the loss in chunks
  and returns its output with ``loss`` set and ``logits=None``; without labels, unchanged;
* ``lm_head.forward``: in such a forward, computes the summed loss in chunks from its input
  (the hidden states) and its weight, and returns an empty stand-in for the logits;
* ``model.loss_function``: divides that sum as HF's ``ForCausalLMLoss`` does (by the tokens
  whose label is not ``ignore_index``, or by ``num_items_in_batch`` when given).

The model's own forward runs, not its base model and then the loss, so each model keeps
its own arguments and what it adds to the loss (a mixture of experts' router loss). The loss
runs inside ``lm_head``'s call, where a strategy that binds a module's parameters for its
forward (the streamed one) has bound the weight. Whatever the model's forward does to the
logits after ``lm_head`` other than ``.float()`` or ``.contiguous()`` is refused when it does
it, naming the operation; heads known to do so (logit soft-capping, scaled logits) are
skipped at ``attach``, with the reason in the record. ``close()`` gives back what was there.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from hpcmem.um.budget.batch_split import BatchSplit, rows_of
from hpcmem.um.budget.chunked_loss import chunk_rows, linear_cross_entropy
from hpcmem.um.errors import BudgetError

__all__ = ["CHUNK_SHARE", "MAX_CHUNK_BYTES", "ChunkedLoss", "causal_lm", "chunk_bytes",
           "unsupported"]

#: The share of the budget a chunk's fp32 logits may take, and the most they take.
CHUNK_SHARE = 1 / 64
MAX_CHUNK_BYTES = 256 * 2**20
#: Config fields whose value changes the logits between ``lm_head`` and the loss, and the
#: value at which they do not (Gemma 2 and 3 soft-cap; Cohere and Granite scale).
HEAD_CONFIG = {"final_logit_softcapping": None, "logit_scale": None, "logits_scaling": 1}
_MISSING = object()


def chunk_bytes(budget: int) -> int:
    """Bytes of a chunk's fp32 logits under ``budget``: ``CHUNK_SHARE`` of it, at most
    ``MAX_CHUNK_BYTES`` (a chunk of a few hundred rows already keeps the GPU busy)."""
    return min(MAX_CHUNK_BYTES, int(budget * CHUNK_SHARE))


def unsupported(model: Any) -> str | None:
    """Why the chunked loss cannot stand in for ``model``'s head and loss (None: it can)."""
    head = getattr(model, "lm_head", None)
    if head is None:
        return "no lm_head"
    if type(head) is not torch.nn.Linear:
        return f"lm_head is a {type(head).__name__}, not a torch.nn.Linear"
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None or base is model:
        base = getattr(model, "base_model", None)
    if base is None or base is model:
        return "no base model behind get_decoder() or base_model"
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab != head.out_features:
        return f"config.vocab_size {vocab} is not lm_head's {head.out_features} outputs"
    if "labels" not in inspect.signature(model.forward).parameters:
        return "its forward takes no labels"
    if not hasattr(model, "loss_function"):
        return "no loss_function"
    for name, neutral in HEAD_CONFIG.items():
        value = getattr(config, name, neutral)
        if value not in (neutral, None):
            return f"config.{name}={value} changes the logits after lm_head"
    return None


def causal_lm(model: Any) -> tuple[Any | None, str | None]:
    """The causal LM in ``model`` the chunked loss stands in for, or why none: ``model``
    itself, else the one module inside it that is one (a trainer's wrapper, such as a
    LightningModule holding a Hugging Face model)."""
    reason = unsupported(model)
    if reason is None:
        return model, None
    found = [m for m in model.modules() if m is not model and unsupported(m) is None]
    if len(found) > 1:
        return None, f"{len(found)} causal LMs inside {type(model).__name__}"
    return (found[0], None) if found else (None, reason)


@dataclass
class _Call:
    """One forward with labels: the targets, and the summed loss once ``lm_head`` made it."""

    labels: Any
    shifted: bool  # the labels are the targets already (``shift_labels``)
    ignore_index: int
    divisor: Any = None  # the whole batch's target count, for a part of a split batch
    total: Any = None
    count: Any = None
    done: bool = False


class ChunkedLoss:
    """The chunked loss on ``model``, or the one causal LM inside it (:func:`causal_lm`),
    where it applies and ``enabled`` (None: wherever it applies; True: refused where it does
    not), rows per chunk from ``budget``; its forward splits a batch the budget cannot hold
    (``split``, :mod:`hpcmem.um.budget.batch_split`; ``batch_split``: None measured, an
    int rows per part, False never)."""

    def __init__(self, model: Any, enabled: bool | None, budget: int,
                 batch_split: bool | int | None = None) -> None:
        self.model, self.reason = causal_lm(model) if enabled is not False else (
            None, "off (chunked_loss=False)")
        if enabled and self.reason:
            raise BudgetError(f"offload chunked_loss: True does not apply to "
                              f"{type(model).__name__}: {self.reason}")
        self.chunk_bytes = chunk_bytes(budget)
        self.rows = 0
        self.split = BatchSplit(None if isinstance(batch_split, bool) else batch_split,
                                enabled=batch_split is not False)
        self._call: _Call | None = None
        self._saved: list[tuple[Any, str, Any, Any]] = []
        self._on = self.reason is None  # until close()
        if self._on:
            self.rows = chunk_rows(self.model.config.vocab_size, self.chunk_bytes)
            self._install()

    @property
    def applied(self) -> bool:
        return self.reason is None

    @property
    def record(self) -> dict[str, Any]:
        """Whether it runs, why not, and its chunks."""
        return {"applied": self.applied, "reason": self.reason,
                "chunk_bytes": self.chunk_bytes if self.applied else None,
                "chunk_rows": self.rows if self.applied else None,
                "batch_split": self.split.record if self.applied else None}

    # -- installing -----------------------------------------------------------------------
    def _install(self) -> None:
        model, head = self.model, self.model.lm_head
        self._set(model, "forward", self._forward(model.forward))
        self._set(head, "forward", self._head(head.forward))
        self._set(model, "_loss_function", self._loss(model.loss_function))  # its setter's

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING), value))
        setattr(owner, name, value)

    def close(self) -> None:
        """Give back each attribute that is still the one installed (one set over it since,
        such as a trainer's wrapper, stays, and what was installed under it passes through)."""
        for owner, name, before, installed in self._saved:
            if owner.__dict__.get(name) is installed:
                if before is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, before)
        self._saved.clear()
        self._on = False

    # -- the three stand-ins ----------------------------------------------------------------
    def _forward(self, forward: Any) -> Any:
        signature = inspect.signature(forward)

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            labels = signature.bind_partial(*args, **kwargs).arguments.get("labels")
            if labels is None or not self._on or self._call is not None:
                return forward(*args, **kwargs)
            named = _named(signature, args, kwargs)
            first = self._split_plan(forward, named, labels)
            if first is None:
                return self._chunked(forward, named)
            return self._split_run(forward, named, labels, first)

        return run

    def _chunked(self, forward: Any, named: dict[str, Any], divisor: Any = None) -> Any:
        """``forward`` over ``named`` with the loss in chunks (divided by ``divisor`` where
        no ``num_items_in_batch`` is given and it is set)."""
        shifted = named.get("shift_labels")
        self._call = _Call(named["labels"] if shifted is None else shifted,
                           shifted is not None, named.get("ignore_index", -100), divisor)
        try:
            output = forward(**named)
            call = self._call
        finally:
            self._call = None
        if not call.done:
            raise BudgetError(
                f"chunked_loss: {type(self.model).__name__}'s forward did not compute its "
                "loss from lm_head's output through loss_function; attach with "
                "chunked_loss=False")
        return _without_logits(output)

    def _split_plan(self, forward: Any, named: dict[str, Any], labels: Any) -> int | None:
        """Rows of a part where this forward's batch is split (None: whole)."""
        if (not torch.is_grad_enabled() or labels.dim() < 2
                or named.get("past_key_values") is not None):
            return None
        rows = labels.shape[0]

        def dry_run(count: int) -> None:  # forward and backward; the strategy drops the grads
            output = self._chunked(forward, rows_of(named, 0, count, rows))
            loss = output[0] if isinstance(output, tuple) else output.loss
            with torch.autocast(loss.device.type, enabled=False):
                loss.backward()

        return self.split.plan(rows, labels.shape[-1], dry_run)

    def _split_run(self, forward: Any, named: dict[str, Any], labels: Any, first: int) -> Any:
        """The batch in parts (:class:`BatchSplit`), each part's loss over the whole batch's
        target count; the output holds the summed loss."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        shifted = named.get("shift_labels")
        targets = shifted if shifted is not None else labels[..., 1:]
        count = (targets != named.get("ignore_index", -100)).sum()
        last: list[Any] = []

        def part(arguments: dict[str, Any]) -> Any:
            output = self._chunked(forward, arguments, divisor=count)
            last[:] = [output]
            return output[0] if isinstance(output, tuple) else output.loss

        loss = self.split.run(part, named, labels.shape[0], first, params)
        if isinstance(last[0], tuple):
            return (loss,)
        return type(last[0])(loss=loss)

    def _head(self, forward: Any) -> Any:
        def run(hidden: Any) -> Any:
            call = self._call
            if call is None or call.total is not None:
                return forward(hidden)
            targets = call.labels.to(hidden.device)
            if not call.shifted:  # position t predicts label t + 1, as ForCausalLMLoss
                targets = torch.nn.functional.pad(targets, (0, 1), value=call.ignore_index)
                targets = targets[..., 1:]
            flat = hidden.reshape(-1, hidden.shape[-1])
            targets = targets.reshape(-1)
            if targets.numel() != flat.shape[0]:
                raise BudgetError(f"chunked_loss: labels hold {targets.numel()} tokens, "
                                  f"lm_head's input {flat.shape[0]}")
            head = self.model.lm_head
            call.total = linear_cross_entropy(flat, head.weight, head.bias, targets,
                                              ignore_index=call.ignore_index, rows=self.rows)
            call.count = (targets != call.ignore_index).sum()
            return NoLogits.standing_for(hidden, self.model)

        return run

    def _loss(self, loss_function: Any) -> Any:
        @functools.wraps(loss_function)
        def run(*args: Any, **kwargs: Any) -> Any:
            call = self._call
            logits = args[0] if args else kwargs.get("logits")
            if call is None or not isinstance(logits, NoLogits):
                return loss_function(*args, **kwargs)
            divisor = kwargs.get("num_items_in_batch")
            if divisor is None:
                divisor = call.count if call.divisor is None else call.divisor
            elif torch.is_tensor(divisor):
                divisor = divisor.to(call.total.device)
            call.done = True
            return call.total / divisor

        return run


class NoLogits(torch.Tensor):
    """An empty stand-in for the logits the chunked loss never made: ``.float()`` and
    ``.contiguous()`` give it back, reading its shape works, any other use is refused."""

    _model: str = ""

    @classmethod
    def standing_for(cls, hidden: Any, model: Any) -> NoLogits:
        out = hidden.new_empty((*hidden.shape[:-1], 0)).as_subclass(cls)
        out._model = type(model).__name__
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        name = getattr(func, "__name__", repr(func))
        if name in ("float", "contiguous"):
            return args[0]
        if name in ("__get__", "__repr__", "__format__"):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        model = next((a._model for a in args if isinstance(a, NoLogits)), "the model")
        raise BudgetError(
            f"chunked_loss: {model}'s forward applies {name} to the logits after lm_head, "
            "which the chunked loss cannot reproduce; attach with chunked_loss=False")


def _without_logits(output: Any) -> Any:
    """``output`` without the stand-in: ``logits=None`` in a model output, left out of a
    tuple (as a tuple leaves out what is None)."""
    if isinstance(output, tuple):
        return tuple(x for x in output if not isinstance(x, NoLogits))
    return type(output)(**{k: v for k, v in output.items() if k != "logits"})


def _named(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
           ) -> dict[str, Any]:
    """A forward's arguments by name, its ``**kwargs`` spread among them."""
    named: dict[str, Any] = {}
    for name, value in signature.bind_partial(*args, **kwargs).arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise BudgetError(f"chunked_loss: the forward took {len(value)} extra "
                                  "positional arguments; pass them by name")
        else:
            named[name] = value
    return named
