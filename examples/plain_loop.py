"""A plain PyTorch training loop under hpcmem's Unified Memory, with or without a GPU budget.

    python examples/plain_loop.py                        # the hpcmem policy, no budget
    python examples/plain_loop.py --gpu-budget 1G        # within 1 GiB of GPU memory
    python examples/plain_loop.py --gpu-budget 1G --offload streamed
    python examples/plain_loop.py --policy cuda          # PyTorch's own allocator

Without a budget the model is built in the params scope and every type of data gets its
pool; under a budget it is built in host memory and ``attach`` hands it, with its optimizer,
to the budget's strategy (docs/gpu-budget.md).
"""

from __future__ import annotations

import torch
from common import BATCH, SHAPE, offload, options, report, require_gpu, token_rows

from hpcmem.train.networks import build
from hpcmem.um import UnifiedMemory


def main() -> None:
    args = options(__doc__)
    require_gpu("examples/plain_loop.py")
    rows = token_rows(args.steps * args.micro_batches * BATCH).split(BATCH)
    torch.manual_seed(0)
    with UnifiedMemory(args.policy, device=0, gpu_budget=args.gpu_budget) as um:
        if args.gpu_budget is None:
            with um.params():
                model = build(SHAPE).cuda()
        else:
            model = build(SHAPE)  # in host memory: the strategy places it
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        um.attach(model, optimizer, offload=offload(args))
        losses = []
        for step in range(args.steps):
            loss_of_step = 0.0
            for micro in range(args.micro_batches):
                tokens = um.stage(rows[step * args.micro_batches + micro])
                with um.activations():  # one micro-batch's forward and backward
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model({"tokens": tokens}) / args.micro_batches
                    loss.backward()
                loss_of_step += loss.item()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss_of_step)
        report(losses, um.stats())


if __name__ == "__main__":
    main()
