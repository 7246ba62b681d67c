"""The models and data ``hf_offload.py`` trains: Hugging Face configs with random weights
(nothing is downloaded) and the same random tokens in every variant."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

__all__ = ["MODELS", "batches", "build", "transformer_blocks"]

MODELS = {
    "gpt2-large": ("GPT2Config", {"n_embd": 1280, "n_layer": 36, "n_head": 20,
                                  "vocab_size": 50257, "n_positions": 1024}),
    "llama-0.9b": ("LlamaConfig", {"hidden_size": 2048, "intermediate_size": 5632,
                                   "num_hidden_layers": 18, "num_attention_heads": 32,
                                   "num_key_value_heads": 4, "vocab_size": 32000,
                                   "max_position_embeddings": 1024}),
    "llama-5b": ("LlamaConfig", {"hidden_size": 4096, "intermediate_size": 11008,
                                 "num_hidden_layers": 28, "num_attention_heads": 32,
                                 "num_key_value_heads": 8, "vocab_size": 32000,
                                 "max_position_embeddings": 1024}),
    # the data-parallel sizes, two families: OpenLLaMA 3B's and Llama 2 7B's shapes (3.4B,
    # 6.7B parameters), Qwen2.5 3B's and 7B's (3.1B tied, 7.6B)
    "llama-3b": ("LlamaConfig", {"hidden_size": 3200, "intermediate_size": 8640,
                                 "num_hidden_layers": 26, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "vocab_size": 32000,
                                 "max_position_embeddings": 1024}),
    "llama-7b": ("LlamaConfig", {"hidden_size": 4096, "intermediate_size": 11008,
                                 "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "vocab_size": 32000,
                                 "max_position_embeddings": 1024}),
    "qwen2-3b": ("Qwen2Config", {"hidden_size": 2048, "intermediate_size": 11008,
                                 "num_hidden_layers": 36, "num_attention_heads": 16,
                                 "num_key_value_heads": 2, "vocab_size": 151936,
                                 "tie_word_embeddings": True, "max_position_embeddings": 1024}),
    "qwen2-7b": ("Qwen2Config", {"hidden_size": 3584, "intermediate_size": 18944,
                                 "num_hidden_layers": 28, "num_attention_heads": 28,
                                 "num_key_value_heads": 4, "vocab_size": 152064,
                                 "tie_word_embeddings": False, "max_position_embeddings": 1024}),
    # the families between 1B and 3B: Qwen2 1.5B's (a 152k vocabulary, tied), Phi-2's
    # (parallel blocks, partial rotary, biases) and Gemma 2B's (a 256k vocabulary, MQA)
    "qwen2-1.5b": ("Qwen2Config", {"hidden_size": 1536, "intermediate_size": 8960,
                                   "num_hidden_layers": 28, "num_attention_heads": 12,
                                   "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True,
                                   "max_position_embeddings": 1024}),
    "phi-2.7b": ("PhiConfig", {"hidden_size": 2560, "intermediate_size": 10240,
                               "num_hidden_layers": 32, "num_attention_heads": 32,
                               "partial_rotary_factor": 0.4, "vocab_size": 51200,
                               "max_position_embeddings": 2048}),
    "gemma-2b": ("GemmaConfig", {"hidden_size": 2048, "intermediate_size": 16384,
                                 "num_hidden_layers": 18, "num_attention_heads": 8,
                                 "num_key_value_heads": 1, "head_dim": 256,
                                 "vocab_size": 256000, "max_position_embeddings": 1024}),
    # more families, below 0.7B: each brings a layout the two above lack
    "qwen2-0.5b": ("Qwen2Config", {"hidden_size": 896, "intermediate_size": 4864,  # tied, qkv bias
                                   "num_hidden_layers": 24, "num_attention_heads": 14,
                                   "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True,
                                   "max_position_embeddings": 1024}),
    "opt-350m": ("OPTConfig", {"hidden_size": 1024, "ffn_dim": 4096,  # projections in and out
                               "num_hidden_layers": 24, "num_attention_heads": 16,
                               "word_embed_proj_dim": 512, "vocab_size": 50272,
                               "do_layer_norm_before": False,
                               "max_position_embeddings": 2048}),
    "pythia-410m": ("GPTNeoXConfig", {"hidden_size": 1024, "intermediate_size": 4096,  # parallel
                                      "num_hidden_layers": 24, "num_attention_heads": 16,
                                      "vocab_size": 50304, "rotary_pct": 0.25,
                                      "max_position_embeddings": 2048}),
    "bloom-560m": ("BloomConfig", {"hidden_size": 1024, "n_layer": 24, "n_head": 16,  # ALiBi
                                   "vocab_size": 250880}),
    "gemma-0.5b": ("GemmaConfig", {"hidden_size": 1024, "intermediate_size": 4096,  # 256k vocab
                                   "num_hidden_layers": 12, "num_attention_heads": 8,
                                   "num_key_value_heads": 1, "head_dim": 128,
                                   "vocab_size": 256000, "max_position_embeddings": 1024}),
    "mixtral-0.5b": ("MixtralConfig", {"hidden_size": 1024, "intermediate_size": 1536,  # MoE
                                       "num_hidden_layers": 8, "num_attention_heads": 16,
                                       "num_key_value_heads": 4, "num_local_experts": 8,
                                       "num_experts_per_tok": 2, "vocab_size": 32000,
                                       "max_position_embeddings": 1024}),
}


def build(name: str) -> Any:
    """The model of ``MODELS[name]``, random weights, fp32, on the host (the same on every
    rank)."""
    import torch
    import transformers

    torch.manual_seed(0)
    kind, fields = MODELS[name]
    config = getattr(transformers, kind)(**fields, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(config)


def batches(batch: int, seq_len: int, accumulate: int, vocab: int, rank: int = 0
            ) -> Iterator[Any]:
    """Pinned random token batches, the same in every variant, rank ``rank``'s own (rank 0's
    are a single process's); one buffer per micro-batch of a step, so no copy still in
    flight is overwritten before the step synchronises."""
    import torch

    generator = torch.Generator().manual_seed(1 + rank)
    ring = [torch.empty(batch, seq_len, dtype=torch.long, pin_memory=True)
            for _ in range(accumulate)]
    for index in itertools.count():
        buffer = ring[index % len(ring)]
        buffer.copy_(torch.randint(vocab, buffer.shape, generator=generator))
        yield buffer


def transformer_blocks(model: Any) -> list[Any]:
    """The elements of the model's largest ``nn.ModuleList``: its transformer blocks (GPT-2's
    ``transformer.h``, Llama's ``model.layers``)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len, default=[]))
