"""Hugging Face ``Trainer`` under hpcmem's Unified Memory: GPT-2 from a config (random weights,
nothing downloaded), bf16, with or without a GPU budget.

    python examples/hf_trainer.py                        # the hpcmem policy, no budget
    python examples/hf_trainer.py --gpu-budget 1G        # within 1 GiB of GPU memory
    python examples/hf_trainer.py --gpu-budget 1G --offload streamed

``UnifiedMemoryTrainer`` is a ``transformers.Trainer``: it attaches the model and optimizer
at the first step and closes the memory when ``train()`` ends
(docs/training-integrations.md). Under a budget, gradient clipping (``max_grad_norm``) and
evaluation are refused; turn them off, as here (checkpoints hold the fp32 state; this
example writes none).
"""

from __future__ import annotations

import tempfile

import torch
import transformers
from common import BATCH, SHAPE, offload, options, report, require_gpu, token_rows

from hpcmem.integrations.hf import UnifiedMemoryTrainer
from hpcmem.um import UnifiedMemory


def main() -> None:
    args = options(__doc__)
    require_gpu("examples/hf_trainer.py")
    rows = token_rows(args.steps * args.micro_batches * BATCH)[:, :SHAPE.seq_len]
    data = [{"input_ids": row, "labels": row} for row in rows]
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=SHAPE.n_layers, n_embd=SHAPE.d_model, n_head=SHAPE.n_heads,
        vocab_size=SHAPE.vocab, n_positions=SHAPE.seq_len, bos_token_id=0, eos_token_id=0,
        use_cache=False))
    with tempfile.TemporaryDirectory() as output, \
            UnifiedMemory(args.policy, device=0, gpu_budget=args.gpu_budget) as um:
        training = transformers.TrainingArguments(
            output_dir=output, max_steps=args.steps, per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=args.micro_batches, learning_rate=1e-3, bf16=True,
            max_grad_norm=0.0, save_strategy="no", logging_steps=1, report_to=[],
            disable_tqdm=True, seed=0)
        trainer = UnifiedMemoryTrainer(model=model, args=training, train_dataset=data,
                                       memory=um, offload=offload(args))
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    report(losses, trainer.memory_stats)


if __name__ == "__main__":
    main()
