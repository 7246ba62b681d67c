"""A batch too large for the budget, split into parts inside the model's forward: exact
accumulation, with no change to the training loop.

A Hugging Face causal LM's forward given ``labels`` (where the chunked loss stands in,
:mod:`hpcmem.um.budget.causal_lm`) runs its batch in parts of rows when the budget's room
holds fewer rows' activations than the batch has. Each part's loss is divided by the whole
batch's target count, so the parts' gradients add up to the whole batch's (float summation
order aside; dropout draws its masks part by part, from the same distribution, not the same
draws). Every part but the last runs forward and backward at once, inside the model's
forward, its gradients summed aside (:attr:`BatchSplit.running` tells the strategy they are
not final); the forward returns the last part's loss plus theirs, and the loop's
``loss.backward()`` (scaled or not) runs the last part's backward, in which each
parameter's gradient gets the earlier sum, times the loss's gradient, as autograd delivers
it (:class:`_Earlier`). Gradient hooks, accumulation over the loop's own micro-batches and
the strategy's shipping so see one gradient per parameter, as without the split, and the
host optimizer steps each bucket as it lands, overlapped with that last backward.

How many rows a part takes is measured, not guessed: before the first such forward, one row,
then two, then twice as many each time, run forward and backward alone, their gradients
dropped as they come (:attr:`BatchSplit.dropping`; the strategy frees each at once, so no
gradient set is held), up to the batch's rows or while twice the last run's device bytes
above those held fit the room. A forward's bytes are the most of its ops' (each some fixed
bytes plus some a row), so twice the rows never take more than twice the bytes: no
measuring run passes the budget. Between two measured row counts a forward takes at most
the straight line between them; past the most rows measured, at most their bytes scaled by
the rows. The last pair's difference is a row's activations (``token_bytes`` a token), the
rest what a forward holds whatever its rows (``fixed_bytes``: the loss's chunk, the output
weight's gradient the chunked loss makes in forward). Two rows alone do not tell them
apart where a fixed op's bytes set the peak of a few rows (a long vocabulary's loss chunk)
and a row's activations that of many. A forward whose rows fit the room (``room()``, what
the budget leaves above the bytes held when it began) then runs whole, as without a split;
one that does not runs in parts of as many rows as fit beside the gradient set a split
holds, or, where not one row does and the strategy can (:class:`HostSums`), of as many as
fit without it, the parts' gradients summed in host memory as they land. The plan scales
with the tokens a row has. The floor is the least of the whole batch, one row beside a
gradient set and, where the parts can sum in host memory, one row alone. Rows per part can
also be set (``rows``). The measuring rows cost the first step up to about twice its
batch's forward and backward more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["BATCH_FIRST", "BatchSplit", "HostSums", "Measure", "rows_of"]

#: A Hugging Face forward's arguments that hold one entry per row of the batch.
BATCH_FIRST = ("input_ids", "attention_mask", "position_ids", "token_type_ids",
               "inputs_embeds", "labels", "shift_labels")


@dataclass(frozen=True)
class Measure:
    """What the split reads from the strategy that bound it."""

    live_bytes: Callable[[], int]  # device bytes allocated now
    peak_bytes: Callable[[], int]  # their peak since the last reset
    reset_peak: Callable[[], None]  # the peak from now on
    room: Callable[[], int]  # device bytes the plan may fill, in all
    grad_bytes: int  # the trained parameters' gradients, one set
    host_sums: HostSums | None = None  # where the parts' gradients can sum off the device

    @classmethod
    def of(cls, transport: Any, room: Callable[[], int], trained: list[Any],
           host_sums: HostSums | None = None) -> Measure:
        """Through ``transport``'s figures, ``room()`` bytes in all, gradients of ``trained``,
        summed in ``host_sums`` where they can be."""
        return cls(transport.live_bytes, transport.peak_bytes, transport.reset_peak, room,
                   sum(p.numel() * p.element_size() for p in trained), host_sums)


class HostSums(Protocol):
    """Where a strategy sums the earlier parts' gradients in host memory, as they land
    (:mod:`hpcmem.um.host_optimizer.part_sums`)."""

    always: bool  # every split forward's parts (else where no gradient set fits beside one)

    def begin(self) -> None:
        """A split forward's parts begin: their gradients go to the host from now on."""

    def part_done(self) -> None:
        """An earlier part's backward is over."""

    def scale(self, value: Any) -> None:
        """The loop's backward began with the loss's gradient ``value``."""


class _Earlier:
    """The earlier parts' summed gradients, added to each parameter's gradient of the last
    part as autograd delivers it (times the loss's gradient), or at the end of backward to
    those the last part gives none."""

    def __init__(self, params: list[Any], sums: list[Any], host: HostSums | None) -> None:
        self.scale: Any = None  # the loss's gradient, known when backward starts
        self.host = host  # where the rest of the earlier parts' gradients were summed
        self._left = {id(p): (p, s) for p, s in zip(params, sums, strict=True)
                      if s is not None}
        self._hooks = [p.register_hook(self._adder(p)) for p, _ in self._left.values()]

    def _adder(self, param: Any) -> Callable[[Any], Any]:
        def add(grad: Any) -> Any:
            entry = self._left.pop(id(param), None)
            if entry is None:  # added already (a backward run again over a kept graph)
                return grad
            return grad + entry[1].mul_(self.scale.to(entry[1].dtype))

        return add

    def started(self, scale: Any) -> None:
        """Backward began with the loss's gradient ``scale``: the rest at its end."""
        self.scale = scale
        if self.host is not None:
            self.host.scale(scale)
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _finish(self) -> None:
        for handle in self._hooks:
            handle.remove()
        for param, summed in self._left.values():
            summed.mul_(self.scale.to(summed.dtype))
            param.grad = summed if param.grad is None else param.grad.add_(summed)
        self._left.clear()


class _PartsLoss(torch.autograd.Function):
    """The last part's loss plus the earlier parts' (a number): backward hands the last
    part's its gradient and the earlier gradients their scale (:class:`_Earlier`)."""

    @staticmethod
    def forward(ctx: Any, last: Any, earlier_total: Any, earlier: _Earlier) -> Any:
        ctx.earlier = earlier
        return last + earlier_total

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        earlier, ctx.earlier = ctx.earlier, None
        earlier.started(grad_output)
        return grad_output, None, None


class BatchSplit:
    """Rows per part of a forward with labels (module docstring); unbound (no strategy
    measures for it), or with ``enabled`` False, every batch runs whole."""

    def __init__(self, rows: int | None = None, enabled: bool = True) -> None:
        self.fixed_rows = rows  # rows per part as set (None: measured)
        self.enabled = enabled
        self.fixed_bytes = 0  # what a forward holds whatever its rows, measured
        self.running = False  # parts are running: gradients are not final yet
        self.dropping = False  # the measuring row runs: its gradients are dropped
        self.measure: Measure | None = None
        self.token_bytes: int | None = None  # one token's activations, measured
        self._used: dict[int, int] = {}  # tokens measured: device bytes above those held
        self.parts = 1  # of the last forward
        self.part_rows: int | None = None  # rows per part of the last split forward
        self.floor_bytes: int | None = None  # the least the measured batch needs, whole or split
        self.floor_split = False  # that least is one row beside a gradient set
        self.host_summed = False  # the last split forward summed its parts in host memory
        self._batch: tuple[int, int, int] | None = None  # the measured batch's rows, tokens
        # a row, and the bytes held when it began

    def bind(self, measure: Measure | None) -> None:
        """Let the split measure and plan through ``measure`` (the strategy's; None: none,
        every batch runs whole)."""
        self.measure = measure

    @property
    def record(self) -> dict[str, Any]:
        """What the split did in the last forward with labels."""
        return {"enabled": self.enabled and self.measure is not None, "parts": self.parts,
                "part_rows": self.part_rows, "token_bytes": self.token_bytes,
                "fixed_bytes": self.fixed_bytes, "floor_bytes": self.floor_bytes,
                "sums": None if self.parts == 1 else "host" if self.host_summed else "device",
                "exact": True}

    def bytes_for(self, tokens: int) -> int:
        """The most device bytes a forward and backward of ``tokens`` tokens takes above
        those held, from the measured runs (module docstring), else from the figures
        ``fixed_bytes`` and ``token_bytes`` alone."""
        assert self.token_bytes is not None
        points = sorted(self._used.items())
        if not points:
            return self.fixed_bytes + self.token_bytes * tokens
        for (t0, u0), (t1, u1) in zip([(0, points[0][1]), *points], points, strict=False):
            if tokens <= t1:
                return u1 if t1 == t0 else u0 + math.ceil((u1 - u0) * (tokens - t0) / (t1 - t0))
        most, used = points[-1]
        return math.ceil(used * tokens / most)

    def _most_rows(self, rows: int, row_tokens: int, room: int) -> int:
        """The most rows of ``rows`` whose forward fits ``room`` bytes (0: not one)."""
        low, high = 0, rows
        while low < high:
            middle = (low + high + 1) // 2
            low, high = ((middle, high) if self.bytes_for(middle * row_tokens) <= room
                         else (low, middle - 1))
        return low

    def _rows_that_fit(self, held: int, rows: int, row_tokens: int) -> tuple[int, bool]:
        """Rows of ``rows`` (of ``row_tokens`` tokens) one part fits in the room above
        ``held`` (at least one), and whether the parts sum their gradients in host memory:
        all rows where they fit; else as many as fit beside a gradient set, or, where not
        one does or the strategy always sums there, as many as fit without it."""
        assert self.measure is not None and self.token_bytes is not None
        room = self.measure.room() - held
        if self.bytes_for(rows * row_tokens) <= room:
            return rows, False
        host = self.measure.host_sums
        beside = self._most_rows(rows, row_tokens, room - self.measure.grad_bytes)
        if host is not None and (host.always or beside < 1):
            return max(1, self._most_rows(rows, row_tokens, room)), True
        return max(1, beside), False

    def plan(self, rows: int, row_tokens: int, dry_run: Callable[[int], None]) -> int | None:
        """Rows of the first part of a forward over ``rows`` rows of ``row_tokens`` tokens
        (None: whole, unsplit). The first such forward measures first: ``dry_run(n)`` runs the
        first ``n`` rows' forward and backward, whose gradients the strategy drops
        (:attr:`dropping`)."""
        self.parts, self.part_rows, self.host_summed = 1, None, False
        if not self.enabled or self.measure is None or rows < 2:
            return None
        if self.fixed_rows is not None:
            host = self.measure.host_sums
            self.host_summed = host is not None and host.always
            return None if self.fixed_rows >= rows else self.fixed_rows
        if self.token_bytes is None:
            self._measure_row(rows, row_tokens, dry_run)
        fit, self.host_summed = self._rows_that_fit(self.measure.live_bytes(), rows,
                                                    row_tokens)
        return None if fit >= rows else fit

    def _measure_row(self, rows: int, row_tokens: int,
                     dry_run: Callable[[int], None]) -> None:
        """The device bytes above those held of one row's forward and backward, two rows',
        and twice as many each time while that is safe (module docstring); from the last
        pair, a token's activations and what a forward holds whatever its rows
        (``fixed_bytes``: the loss's chunk, the output weight's gradient made in forward);
        and the floor: the least of the whole batch and of one row beside a gradient set."""
        assert self.measure is not None
        held = self.measure.live_bytes()
        self._used.clear()
        self.dropping = True
        try:
            count = 0
            while count < rows and (count < 2 or held + 2 * self._used[count * row_tokens]
                                    <= self.measure.room()):
                count = min(rows, max(1, 2 * count))
                self.measure.reset_peak()
                dry_run(count)
                self._used[count * row_tokens] = max(0, self.measure.peak_bytes() - held)
        finally:
            self.dropping = False
        (before, low), (last, high) = sorted(self._used.items())[-2:]
        self.token_bytes = max(1, math.ceil((high - low) / (last - before)))
        self.fixed_bytes = max(0, high - self.token_bytes * last)
        self._batch = (rows, row_tokens, held)
        whole = held + self.bytes_for(rows * row_tokens)
        one_row = self._used[row_tokens]
        split = held + one_row + (0 if self.measure.host_sums else self.measure.grad_bytes)
        self.floor_bytes, self.floor_split = min(whole, split), split < whole

    def run(self, forward: Callable[[dict[str, Any]], Any], arguments: dict[str, Any],
            rows: int, first: int, params: list[Any]) -> Any:
        """``forward`` (a part's arguments to its loss, already divided by the whole batch's
        target count) over ``arguments`` in parts of ``first`` rows: every part's backward
        but the last's run at once, their gradients summed aside; the last part's loss plus
        theirs is returned, and its backward (the loop's) adds the earlier sums to each
        parameter's gradient as autograd delivers it, so the strategy ships each as it
        lands, overlapped with that backward."""
        earlier = [p.grad for p in params]  # the loop's own accumulation, kept aside
        for p in params:
            p.grad = None
        total, start, parts = None, 0, 0
        host = self.measure.host_sums if self.host_summed and self.measure else None
        if host is not None:
            host.begin()
        self.running = True
        try:
            while rows - start > first:
                loss = forward(rows_of(arguments, start, start + first, rows))
                with torch.autocast(loss.device.type, enabled=False):
                    loss.backward()
                if host is not None:
                    host.part_done()
                total = loss.detach() if total is None else total + loss.detach()
                start, parts = start + first, parts + 1
        finally:
            self.running = False
            sums = [p.grad for p in params]
            for p, grad in zip(params, earlier, strict=True):
                p.grad = grad
        last = forward(rows_of(arguments, start, rows, rows))
        self.parts, self.part_rows = parts + 1, first
        if total is None:
            return last
        return _PartsLoss.apply(last, total, _Earlier(params, sums, host))

    def whole_bytes(self) -> int | None:
        """The device bytes the measured batch reaches whole, where batches of its size run
        whole (None: they are split, or nothing was measured)."""
        if self._batch is None or self.token_bytes is None or self.measure is None:
            return None
        rows, row_tokens, held = self._batch
        if self._rows_that_fit(held, rows, row_tokens)[0] < rows:
            return None
        return held + self.bytes_for(rows * row_tokens)

    def add_kept(self, nbytes: int) -> None:
        """Blocks no longer recomputed keep ``nbytes`` more over the measured batch (less,
        where negative: blocks recomputed again): a token's activations change by their
        share."""
        if self._batch is not None and self.token_bytes is not None and nbytes:
            rows, row_tokens, _ = self._batch
            per_token = math.ceil(nbytes / (rows * row_tokens))
            self.token_bytes += per_token
            self._used = {tokens: used + per_token * tokens
                          for tokens, used in self._used.items()}


def rows_of(arguments: dict[str, Any], start: int, stop: int, rows: int) -> dict[str, Any]:
    """``arguments`` with every per-row tensor (``BATCH_FIRST``) cut to rows start..stop."""
    return {name: value[start:stop] if name in BATCH_FIRST and torch.is_tensor(value)
            and value.dim() > 0 and value.shape[0] == rows else value
            for name, value in arguments.items()}
