"""The torch modules of the shapes in ``hpcmem.train.models`` (imported only when a model is built).

Both take a batch as produced by ``hpcmem.train.data`` and return the training loss,
so the loop treats them alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpcmem.train.models import CNNShape, TransformerShape, loss_chunk_rows

__all__ = ["ResNet", "TransformerLM", "build", "chunked_cross_entropy"]

INIT_STD = 0.02


class _Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="tanh")
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv(self.ln1(x)).view(batch, seq, 3, self.n_heads, width // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, width))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    """Decoder-only language model; the output head is the token embedding (tied)."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.shape = shape
        self.tokens = nn.Embedding(shape.vocab, shape.d_model)
        self.positions = nn.Embedding(shape.seq_len, shape.d_model)
        self.blocks = nn.ModuleList(
            _Block(shape.d_model, shape.n_heads) for _ in range(shape.n_layers)
        )
        self.ln_f = nn.LayerNorm(shape.d_model)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Next-token cross-entropy of ``batch["tokens"]`` (batch x (seq_len + 1) ids)."""
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.tokens(inputs) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        hidden = self.ln_f(x).flatten(0, 1)
        return chunked_cross_entropy(hidden, self.tokens.weight.t(), targets.flatten())


def chunked_cross_entropy(
    hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ head`` against ``targets``, ``LOSS_CHUNK_BYTES`` of
    logits at a time: each chunk's logits are made again in backward (checkpointed), so a
    50k-word vocabulary never needs the whole batch's logits at once. The chunking depends
    on the shapes alone, so a run gives the same loss whatever memory it runs in."""
    rows = loss_chunk_rows(head.shape[1])
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], rows):
        end = start + rows
        total = total + checkpoint(
            _loss_sum, hidden[start:end], head, targets[start:end], use_reentrant=False
        )
    return total / targets.numel()


def _loss_sum(hidden: torch.Tensor, head: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((hidden @ head).float(), targets, reduction="sum")


class _Bottleneck(nn.Module):
    """1x1 → 3x3 (strided) → 1x1 (4x wider) convolutions with BatchNorm and a residual."""

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with bottleneck blocks (ResNet-50 at the default shape), for image classification."""

    def __init__(self, shape: CNNShape) -> None:
        super().__init__()
        self.shape = shape
        layers: list[nn.Module] = [
            nn.Conv2d(3, shape.width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(shape.width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        channels = shape.width
        for width, blocks, stride in shape.stages():
            for block in range(blocks):
                layers.append(_Bottleneck(channels, width, stride if block == 0 else 1))
                channels = 4 * width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, shape.classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy of ``batch["images"]`` (Nx3xHxW) against ``batch["labels"]``."""
        features = self.features(batch["images"]).mean(dim=(2, 3))
        return F.cross_entropy(self.classifier(features).float(), batch["labels"])


def build(shape: TransformerShape | CNNShape) -> nn.Module:
    """The model for ``shape``, randomly initialised from torch's current RNG state."""
    if isinstance(shape, TransformerShape):
        return TransformerLM(shape)
    return ResNet(shape)
