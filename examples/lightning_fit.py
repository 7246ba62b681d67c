"""PyTorch Lightning under hpcmem's Unified Memory: hpcmem's transformer, bf16, with or
without a GPU budget.

    python examples/lightning_fit.py                     # the hpcmem policy, no budget
    python examples/lightning_fit.py --gpu-budget 1G     # within 1 GiB of GPU memory
    python examples/lightning_fit.py --gpu-budget 1G --offload streamed

``UnifiedMemoryStrategy`` is a Lightning ``Strategy`` (one GPU here; ``devices=N`` trains
data-parallel, one rank a GPU): it attaches the module
and its optimizer as training starts and closes the memory at teardown
(docs/training-integrations.md). Under a budget, validation and gradient clipping under the
host optimizer are refused; turn them off, as here (checkpoints hold the fp32 state; this
example writes none).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from common import BATCH, SHAPE, offload, options, report, require_gpu, token_rows

from hpcmem.integrations.lightning import UnifiedMemoryStrategy
from hpcmem.train.networks import build
from hpcmem.um import UnifiedMemory


class LanguageModel(pl.LightningModule):
    """hpcmem's transformer; the loss of each optimizer step recorded."""

    def __init__(self, micro_batches: int) -> None:
        super().__init__()
        self.net = build(SHAPE)
        self.micro_batches = micro_batches
        self.losses: list[float] = []

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        loss = self.net({"tokens": batch[0]})
        if index % self.micro_batches == 0:
            self.losses.append(0.0)
        self.losses[-1] += loss.item() / self.micro_batches
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    args = options(__doc__)
    require_gpu("examples/lightning_fit.py")
    rows = token_rows(args.steps * args.micro_batches * BATCH)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=BATCH)
    torch.manual_seed(0)
    module = LanguageModel(args.micro_batches)
    with UnifiedMemory(args.policy, device=0, gpu_budget=args.gpu_budget) as um:
        strategy = UnifiedMemoryStrategy(um, offload(args))
        trainer = pl.Trainer(
            accelerator="gpu", devices=1, strategy=strategy, precision="bf16-mixed",
            max_steps=args.steps, accumulate_grad_batches=args.micro_batches,
            enable_checkpointing=False, logger=False, enable_progress_bar=False,
            enable_model_summary=False)
        trainer.fit(module, data)
    report(module.losses, strategy.memory_stats)


if __name__ == "__main__":
    main()
