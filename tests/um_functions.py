"""What the budget tests train through (CPU and GPU alike): a residual block, a custom
autograd function, and a small language model with its optimizer."""

from __future__ import annotations

import torch
from torch import nn


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


class Block(nn.Module):
    """LayerNorm, a widening and a narrowing Linear, and a residual connection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


#: The token vocabulary of :class:`Net`.
VOCAB = 512


class Net(nn.Module):
    """Repeated blocks, a tied embedding, a frozen parameter and a buffer."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        nn.init.normal_(self.embed.weight, std=0.02)  # as language models start: loss ~ln(VOCAB)
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        self.frozen = nn.Parameter(torch.ones(width), requires_grad=False)
        self.register_buffer("scale", torch.full((width,), 0.5))

    def forward(self, tokens):
        x = self.embed(tokens) * self.frozen
        for block in self.blocks:
            x = block(x)
        logits = (x * self.scale * 2) @ self.embed.weight.t()
        # the next token: a loss that stays away from 0, so every step has gradients
        return nn.functional.cross_entropy(logits[:-1].float(), tokens[1:])


def tiny_qwen2():
    """A two-layer Qwen2 causal LM (512-token tied vocabulary), seeded: where the chunked
    loss and the batch split apply."""
    import transformers

    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        use_cache=False))


def make_optimizer(model, kind="AdamW", groups=False):
    """``kind`` over ``model``'s trained parameters; ``groups``: HF's two param groups."""
    if groups:  # HF's layout: weight decay on matrices, none on biases and norms
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]
        rest = [p for p in model.parameters() if p.requires_grad and p.dim() <= 1]
        params = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    if kind == "SGD":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    return getattr(torch.optim, kind)(params, lr=1e-3, fused=True)
