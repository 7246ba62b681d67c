"""Synthetic training data, produced on the CPU every step as a data loader would.

A seeded random dataset lives in host memory (a token stream, or a pool of images
and labels). Each step the CPU gathers a shuffled batch from it and writes it into
tensors the caller provides (``fill``): host staging buffers that are then copied
to the GPU, or host-visible views of managed memory that the GPU reads directly.
The same seed gives the same batches on every device and policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Field", "SyntheticImages", "SyntheticTokens", "synthetic_data"]

#: The image pool holds this many batches' worth of distinct samples.
IMAGE_POOL_BATCHES = 2
#: The token stream holds this many batches' worth of tokens.
TOKEN_POOL_BATCHES = 4


@dataclass(frozen=True)
class Field:
    """One tensor of a batch: its name, shape and dtype name (``torch.<dtype>``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Size of the tensor in bytes."""
        import torch

        count = 1
        for extent in self.shape:
            count *= extent
        return count * getattr(torch, self.dtype).itemsize


class SyntheticTokens:
    """Windows of ``seq_len + 1`` token ids at random offsets of a random token stream."""

    def __init__(self, batch: int, seq_len: int, vocab: int, seed: int) -> None:
        import torch

        self.batch, self.seq_len = batch, seq_len
        self.generator = torch.Generator().manual_seed(seed)
        length = TOKEN_POOL_BATCHES * batch * (seq_len + 1)
        self.stream = torch.randint(vocab, (length,), generator=self.generator)
        self.window = torch.arange(seq_len + 1)

    def fields(self) -> list[Field]:
        """The batch's tensors."""
        return [Field("tokens", (self.batch, self.seq_len + 1), "int64")]

    def fill(self, out: dict[str, torch.Tensor]) -> None:
        """Write the next batch into ``out["tokens"]`` (a CPU-writable tensor)."""
        import torch

        last = self.stream.numel() - self.seq_len - 1
        starts = torch.randint(last + 1, (self.batch, 1), generator=self.generator)
        index = (starts + self.window).flatten()
        torch.index_select(self.stream, 0, index, out=out["tokens"].view(-1))

    def items(self) -> int:
        """Tokens per batch (the throughput unit)."""
        return self.batch * self.seq_len


class SyntheticImages:
    """Shuffled batches of random fp32 images (Nx3xHxW) and int64 labels from a fixed pool."""

    def __init__(self, batch: int, image_size: int, classes: int, seed: int) -> None:
        import torch

        self.batch, self.image_size = batch, image_size
        self.generator = torch.Generator().manual_seed(seed)
        pool = IMAGE_POOL_BATCHES * batch
        self.images = torch.randn((pool, 3, image_size, image_size), generator=self.generator)
        self.labels = torch.randint(classes, (pool,), generator=self.generator)

    def fields(self) -> list[Field]:
        """The batch's tensors."""
        size = self.image_size
        return [
            Field("images", (self.batch, 3, size, size), "float32"),
            Field("labels", (self.batch,), "int64"),
        ]

    def fill(self, out: dict[str, torch.Tensor]) -> None:
        """Write the next batch into ``out["images"]`` and ``out["labels"]`` (CPU-writable)."""
        import torch

        index = torch.randperm(self.labels.numel(), generator=self.generator)[: self.batch]
        torch.index_select(self.images, 0, index, out=out["images"])
        torch.index_select(self.labels, 0, index, out=out["labels"])

    def items(self) -> int:
        """Images per batch (the throughput unit)."""
        return self.batch


def synthetic_data(
    model: str, *, batch: int, seq_len: int, vocab: int, image_size: int, classes: int, seed: int
) -> SyntheticTokens | SyntheticImages:
    """The data source for ``model`` (``transformer`` or ``cnn``)."""
    if model == "transformer":
        return SyntheticTokens(batch, seq_len, vocab, seed)
    return SyntheticImages(batch, image_size, classes, seed)

