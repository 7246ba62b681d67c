"""The benchmark's models, randomly initialised: a decoder-only transformer LM and a ResNet.

Each model has a frozen *shape* (a dataclass) that knows its exact parameter count
and an activation-memory estimate without allocating anything, so a shape can be
chosen for a target parameter count (``--params``) or memory footprint
(``--oversubscribe``) before a single tensor exists. This module imports no torch:
:func:`hpcmem.train.networks.build` makes the ``torch.nn.Module`` of a shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "MODELS",
    "CNNShape",
    "TransformerShape",
    "cnn_shape",
    "loss_chunk_rows",
    "transformer_shape",
]

#: ``--model`` values.
MODELS = ("transformer", "cnn")

#: Width of the GPT-2 tokenizer's vocabulary, padded to a multiple of 64.
DEFAULT_VOCAB = 50304
#: Target ratio of width to depth (GPT-3 spans 64-128; 96 sits between).
ASPECT = 96
#: Classes of the CNN's classifier (ImageNet's 1000).
CNN_CLASSES = 1000
#: Bottleneck blocks per stage: ResNet-50.
CNN_BLOCKS = (3, 4, 6, 3)
#: Base width of ResNet-50's first stage.
CNN_BASE_WIDTH = 64
#: fp32 logits per chunk of the language model's loss (never the whole batch's at once).
LOSS_CHUNK_BYTES = 128 * 2**20
#: Base widths ``--params`` chooses from: any below 256, multiples of 8 (tensor cores) above.
CNN_WIDTHS = (*range(4, 256), *range(256, 4097, 8))


def loss_chunk_rows(vocab: int) -> int:
    """Tokens per chunk of the language model's loss: ``LOSS_CHUNK_BYTES`` of fp32 logits."""
    return max(1, LOSS_CHUNK_BYTES // (vocab * 4))


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-style decoder: pre-LayerNorm blocks, learned positions, tied embeddings."""

    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab: int = DEFAULT_VOCAB

    def param_count(self) -> int:
        """Exact number of parameters (the output head shares the token embedding)."""
        d = self.d_model
        per_layer = 12 * d * d + 13 * d  # qkv, proj, fc, out (+biases), two LayerNorms
        return self.vocab * d + self.seq_len * d + 2 * d + self.n_layers * per_layer

    def activation_bytes(self, batch: int, act_bytes: int) -> int:
        """Estimated peak activation memory of one training step, in bytes.

        Per block, the tensors autograd saves for backward, in units of
        batch x seq_len x d_model: the two LayerNorm inputs (the fp32 residual
        stream, 4 bytes each) and, in the compute dtype (``act_bytes``), the qkv
        input, q, k, v, the attention output and its projection input, the MLP
        input, and the 4xd GELU input and output (15 values). Attention runs
        through fused scaled-dot-product kernels, so no seq_len^2 term. The head
        adds, for one chunk of the loss (:func:`loss_chunk_rows` tokens), the logits
        in the compute dtype, their fp32 log-softmax and the fp32 gradient.
        """
        tokens = batch * self.seq_len
        blocks = self.n_layers * tokens * self.d_model * (8 + 15 * act_bytes)
        chunk = min(tokens, loss_chunk_rows(self.vocab))
        head = tokens * self.d_model * (4 + act_bytes) + chunk * self.vocab * (act_bytes + 8)
        return blocks + head


@dataclass(frozen=True)
class CNNShape:
    """A ResNet with bottleneck blocks (``width`` 64 is ResNet-50) on square RGB images."""

    width: int = CNN_BASE_WIDTH
    image_size: int = 224
    blocks: tuple[int, ...] = CNN_BLOCKS
    classes: int = CNN_CLASSES

    def stages(self) -> list[tuple[int, int, int]]:
        """(bottleneck width, blocks, stride) of each stage."""
        return [
            (self.width * 2**i, count, 1 if i == 0 else 2) for i, count in enumerate(self.blocks)
        ]

    def param_count(self) -> int:
        """Exact number of parameters (convolutions have no bias; BatchNorm has two per channel)."""
        count = 3 * 49 * self.width + 2 * self.width  # stem conv + BN
        channels = self.width
        for width, blocks, _stride in self.stages():
            out = 4 * width
            for block in range(blocks):
                count += channels * width + 9 * width * width + width * out
                count += 2 * (width + width + out)
                if block == 0:
                    count += channels * out + 2 * out  # downsample conv + BN
                channels = out
        return count + channels * self.classes + self.classes

    def activation_bytes(self, batch: int, act_bytes: int) -> int:
        """Estimated peak activation memory of one training step, in bytes.

        Every convolution's output is saved twice for backward (as the
        BatchNorm input and as the ReLU result or residual sum that follows),
        plus the stem's pooling; all in the compute dtype.
        """
        side = self.image_size // 2  # after the stride-2 stem convolution
        elements = 2 * self.width * side * side
        side //= 2  # max pool
        elements += self.width * side * side
        for width, blocks, stride in self.stages():
            for block in range(blocks):
                outer = side // stride if block == 0 else side
                elements += 2 * (width * side * side + width * outer * outer)
                elements += 2 * 4 * width * outer * outer
                if block == 0:
                    elements += 4 * width * outer * outer  # downsample output
                side = outer
        return batch * (elements + 3 * self.image_size**2) * act_bytes


def _transformer_shape_for(layers: int, params: int, seq_len: int, vocab: int) -> TransformerShape:
    """The shape with ``layers`` blocks whose width best matches ``params``."""
    # params = 12·L·d² + (13·L + vocab + seq_len + 2)·d, solved for d.
    a, b = 12 * layers, 13 * layers + vocab + seq_len + 2
    d_exact = (-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)
    head_dim = 128 if d_exact >= 2048 else 64
    d_model = max(head_dim, head_dim * round(d_exact / head_dim))
    return TransformerShape(layers, d_model, d_model // head_dim, seq_len, vocab)


def transformer_shape(params: int, seq_len: int, vocab: int = DEFAULT_VOCAB) -> TransformerShape:
    """Depth, width and heads for about ``params`` parameters.

    Among depths 1-256 (width a multiple of the head size: 64, or 128 from
    width 2048 up), the shapes within 3% of the target are kept and the one
    closest to a width/depth ratio of ``ASPECT`` wins; if none is that close
    (tiny targets), the closest count wins.
    """
    if params < 1:
        raise ValueError(f"params {params} must be positive")
    shapes = [_transformer_shape_for(layers, params, seq_len, vocab) for layers in range(1, 257)]

    def error(shape: TransformerShape) -> float:
        return abs(shape.param_count() / params - 1)

    close = [shape for shape in shapes if error(shape) <= 0.03]
    if not close:
        return min(shapes, key=error)
    return min(close, key=lambda s: abs(math.log(s.d_model / (ASPECT * s.n_layers))))


def cnn_shape(params: int | None, image_size: int) -> CNNShape:
    """The ResNet (ResNet-50 depth) whose base width (``CNN_WIDTHS``) best matches ``params``.

    None gives ResNet-50 itself (width 64).
    """
    if params is None:
        return CNNShape(image_size=image_size)
    if params < 1:
        raise ValueError(f"params {params} must be positive")
    return min(
        (CNNShape(width=w, image_size=image_size) for w in CNN_WIDTHS),
        key=lambda s: abs(s.param_count() - params),
    )

