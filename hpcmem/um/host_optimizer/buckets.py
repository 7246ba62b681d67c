"""Parameters grouped into buckets: what one host optimizer step and one copy each way move.

Buckets follow the order in which autograd finishes gradients, approximately: the reverse of
the order in which the model registers its parameters (the last layer's gradients are ready
first). A bucket holds parameters of one optimizer param group (it is stepped with that
group's hyperparameters) up to ``bucket_bytes`` of working weights; a larger parameter gets
a bucket of its own, and a group keeps one bucket open while others fill, so a model whose
groups alternate (weights with weight decay, biases and norms without) still gets full
buckets. Each parameter's slot in a bucket's flat buffers starts at a multiple of ``ALIGN``
elements, so every slot is a well-aligned view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALIGN", "Bucket", "lay_out"]

#: Elements each slot's start is a multiple of (128 bytes of bf16, 256 of fp32).
ALIGN = 64


@dataclass
class Bucket:
    """Parameters of one param group sharing flat buffers; ``offsets[i]`` is where
    ``params[i]`` starts, in elements; ``numel`` the flat buffers' length."""

    index: int
    group: int
    params: list[Any] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    numel: int = 0

    def add(self, param: Any) -> None:
        """Give ``param`` the next aligned slot."""
        self.offsets.append(self.numel)
        self.params.append(param)
        self.numel += -(-param.numel() // ALIGN) * ALIGN

    def slot(self, flat: Any, position: int) -> Any:
        """The view of ``flat`` that holds parameter ``position``, in its shape."""
        param = self.params[position]
        start = self.offsets[position]
        return flat[start : start + param.numel()].view(param.shape)


def lay_out(
    params: Sequence[Any], groups: Sequence[int], bucket_bytes: int, itemsize: int
) -> list[Bucket]:
    """Buckets of ``params`` (given in the order gradients are expected), ``groups[i]`` the
    param group of ``params[i]``, each at most ``bucket_bytes`` of ``itemsize``-byte
    elements unless one parameter alone is larger; numbered in the order they close."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: {bucket_bytes} must be positive")
    limit = max(1, bucket_bytes // itemsize)
    open_buckets: dict[int, Bucket] = {}
    closed: list[Bucket] = []
    for param, group in zip(params, groups, strict=True):
        bucket = open_buckets.get(group)
        if bucket is not None and bucket.params and bucket.numel + param.numel() > limit:
            closed.append(bucket)
            bucket = None
        if bucket is None:
            bucket = open_buckets[group] = Bucket(index=-1, group=group)
        bucket.add(param)
        if bucket.numel >= limit:
            closed.append(open_buckets.pop(group))
    closed += [b for b in open_buckets.values() if b.params]
    for index, bucket in enumerate(closed):
        bucket.index = index
    return closed
