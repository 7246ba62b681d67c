"""A tensor's memory as raw bytes: its size, and a CPU alias of managed memory; whether a
value is a tensor at all; fp32 rounded stochastically to bf16.

A leaf: it imports nothing of the package, so the managed implementation and the budget
strategies all use it without importing each other (torch and NumPy are imported on use).
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["host_view", "is_tensor", "round_stochastic", "tensor_bytes"]


def tensor_bytes(tensor: Any) -> int:
    """The bytes of a tensor's elements (``numel() * element_size()``)."""
    return tensor.numel() * tensor.element_size()


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.Tensor`` (torch is imported on use)."""
    import torch

    return isinstance(value, torch.Tensor)


def host_view(tensor: Any) -> Any:
    """A CPU tensor aliasing a contiguous managed CUDA tensor's memory (for CPU writes)."""
    import numpy as np
    import torch

    if not tensor.is_contiguous():
        raise ValueError("host_view: the tensor must be contiguous")
    raw = (ctypes.c_uint8 * tensor_bytes(tensor)).from_address(tensor.data_ptr())
    return torch.from_numpy(np.ctypeslib.as_array(raw)).view(tensor.dtype).view(tensor.shape)


def round_stochastic(tensor: Any, dtype: Any, seed: int) -> Any:
    """``tensor`` in ``dtype``: to bf16, each element rounded up with the probability of the
    bits it drops, so exact on average (noise from a generator on the tensor's device seeded
    with ``seed``: the same seed, the same bits); to any other dtype, as ``to`` rounds."""
    import torch

    if dtype != torch.bfloat16:
        return tensor.to(dtype)
    generator = torch.Generator(tensor.device).manual_seed(seed)
    noise = torch.randint(0, 1 << 16, tensor.shape, dtype=torch.int32, device=tensor.device,
                          generator=generator)
    noise.add_(tensor.float().view(torch.int32)).bitwise_and_(-(1 << 16))
    return noise.view(torch.float32).to(dtype)  # exact: the dropped bits are zero
