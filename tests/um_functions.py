"""A custom autograd function the streaming tests train through (CPU and GPU alike)."""

from __future__ import annotations

import torch


class Square(torch.autograd.Function):
    """``(x @ weight) ** 2`` with its own backward, given a parameter as input."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return (x @ weight) ** 2

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        inner = 2 * (x @ weight) * grad
        return inner @ weight.t(), x.t() @ inner
