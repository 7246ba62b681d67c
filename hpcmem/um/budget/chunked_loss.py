"""The output projection and cross-entropy in chunks of rows: the loss without whole logits.

:class:`LinearCrossEntropy` computes ``sum(cross_entropy(hidden @ weight.T + bias, targets))``
over the rows whose target is not ``ignore_index``, a chunk of rows at a time: each chunk's
logits are made in the compute dtype (the autocast dtype under autocast), widened to fp32
for the log-sum-exp and the softmax, and turned in place into their own gradient, from which
the chunk's ``grad_hidden`` rows and its share of ``grad_weight`` (and ``grad_bias``) are
taken at once. Forward so keeps only the gradients, as Liger Kernel does; backward scales
them by the loss's gradient. No more than one chunk's logits exist at any time, forward or
backward, and the weight is not needed in backward (the streamed strategy need not fetch it
again). ``grad_weight`` accumulates in the weight's dtype (fp32 for fp32 weights, so a bf16
chunk product is added to an fp32 sum).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LinearCrossEntropy", "chunk_rows", "compute_dtype", "linear_cross_entropy"]

#: Bytes of one fp32 logit.
FP32 = 4


def chunk_rows(vocab: int, chunk_bytes: int) -> int:
    """Rows per chunk so that a chunk's fp32 logits take at most ``chunk_bytes`` (one at least)."""
    return max(1, chunk_bytes // (vocab * FP32))


def compute_dtype(hidden: Any, weight: Any) -> Any:
    """The dtype the projection runs in: autocast's where it is on, else the inputs' common one."""

    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def linear_cross_entropy(
    hidden: Any, weight: Any, bias: Any | None, targets: Any, *, ignore_index: int = -100,
    rows: int,
) -> Any:
    """The summed cross-entropy of ``hidden @ weight.T + bias`` (``hidden``: tokens x width)
    against ``targets``, ``rows`` rows at a time; gradients are kept when autograd will
    ask for them."""

    if rows < 1:
        raise ValueError(f"rows: {rows} must be >= 1")
    # Read without dispatch: the streamed strategy would bind and drop the parameters around
    # each read, and autograd must record them bound when the function is applied.
    with torch._C.DisableTorchFunction():
        grads = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (hidden, weight, bias))
        dtype = compute_dtype(hidden, weight)
    return LinearCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, rows, dtype,
                                    grads)


class LinearCrossEntropy(torch.autograd.Function):
    """The summed loss; its gradients are computed in forward and scaled in backward."""

    @staticmethod
    def forward(ctx: Any, hidden: Any, weight: Any, bias: Any | None, targets: Any,
                ignore_index: int, rows: int, dtype: Any, grads: bool) -> Any:
        need = tuple(grads and n for n in ctx.needs_input_grad[:3])
        with torch.autocast(hidden.device.type, enabled=False):
            total, kept = _chunks(hidden, weight, bias, targets, ignore_index, rows, dtype,
                                  need)
        ctx.kept = kept
        return total

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
        if ctx.kept is None:
            raise RuntimeError("the chunked loss's backward runs once per forward (its "
                               "gradients were computed in forward and are spent)")
        kept, ctx.kept = ctx.kept, None
        scaled = [g.mul_(grad) if g is not None else None for g in kept]
        return (*scaled, None, None, None, None, None)


def _chunks(hidden: Any, weight: Any, bias: Any | None, targets: Any, ignore_index: int,
            rows: int, dtype: Any, need: tuple[bool, ...]) -> tuple[Any, list[Any] | None]:
    """The summed loss and, where ``need`` asks, the gradients of hidden, weight and bias."""
    # Detached aliases first: an operation on a parameter itself lets the streamed strategy
    # bind and drop it around that one use; these keep the device copy for the whole loop.
    weight = weight.detach()
    bias = bias.detach() if bias is not None else None
    w = weight.to(dtype)
    b = bias.to(dtype) if bias is not None else None
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if need[0] else None
    grad_weight = torch.zeros_like(weight) if need[1] else None
    grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need[2] else None
    del weight  # a wider copy than ``w`` is freed here (streamed fp32 weights under autocast)
    for start in range(0, hidden.shape[0], rows):
        h = hidden[start:start + rows].detach().to(dtype)
        target = targets[start:start + rows]
        logits = (torch.addmm(b, h, w.t()) if b is not None else h @ w.t()).float()
        kept = target != ignore_index
        column = torch.where(kept, target, 0).unsqueeze(1)  # an ignored row's: any valid one
        picked = logits.gather(1, column).squeeze(1)
        top = logits.amax(dim=1, keepdim=True)
        probs = logits.sub_(top).exp_()  # in place: the chunk's fp32 logits are reused
        sums = probs.sum(dim=1)
        total += torch.where(kept, top.squeeze(1) + sums.log() - picked, 0).sum()
        if not any(need):
            continue
        probs.div_(sums.unsqueeze(1))  # softmax, less the one-hot: d(loss)/d(logits)
        probs.scatter_add_(1, column, kept.unsqueeze(1).to(probs.dtype).neg())  # no host sync
        probs.mul_(kept.unsqueeze(1))
        if grad_bias is not None:
            grad_bias += probs.sum(dim=0)
        g = probs.to(dtype)
        del probs, logits
        if grad_hidden is not None:
            grad_hidden[start:start + rows] = g @ w
        if grad_weight is not None and grad_weight.dtype == dtype:
            grad_weight.addmm_(g.t(), h)
        elif grad_weight is not None:
            grad_weight += g.t() @ h
    if not any(need):
        return total, None
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return total, [grad_hidden, grad_weight, grad_bias]
