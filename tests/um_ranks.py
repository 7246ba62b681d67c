"""One rank of the data-parallel budget tests (``tests/test_um_data_parallel.py``), started as
``torchrun`` starts one: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in the
environment, gloo between the ranks, the host-optimizer strategy over the CPU transport.

``python tests/um_ranks.py CONFIG OUT``: trains :class:`um_functions.Net` on this rank's
slice of each global batch as :func:`train` does, for each of the JSON ``CONFIG``'s
``cases`` (:func:`train`'s keywords; ``budget_step``: rank ``r``'s budget is ``r`` steps
above the first's), and writes ``OUT/rank<R>.pt``: per case the losses averaged over the
ranks, the strategy's stats and the parameters after ``close()``. A refused case writes
one line on stderr, and the rank exits 2 once every case has run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from cpu_memory import CpuMemory
from um_functions import VOCAB, Net, make_optimizer

from hpcmem.errors import HpcmemError
from hpcmem.um.budget.offload import offload_named
from hpcmem.um.budget.parallel import data_parallel

#: The global batch: rows of tokens, split between the ranks (rows divisible by 1, 2, 4).
ROWS, LENGTH = 4, 64
BUDGET = 2**30
#: Small buckets, so that a step has many and HF's two param groups fill them out of order.
BUCKET_BYTES = 64 * 1024


def train(world: int, rank: int, *, steps: int = 4, micro_batches: int = 1,
          budget: int = BUDGET, strategy: str = "host_optimizer", device: str = "cpu",
          max_grad_norm: float | None = None, process_group: Any = None,
          save: str | None = None, resume: str | None = None, skip: int = 0
          ) -> tuple[list[float], dict[str, Any], list[Any]]:
    """Per step, this rank's mean loss over its rows of each micro-batch (summed over the
    micro-batches); the strategy's stats; the parameters after ``close()``. ``device``
    other than the CPU: only the group's check for it (the CPU transport is the CPU's).
    ``resume``: the model's and optimizer's state dicts loaded from that file after
    ``attach``, the first ``skip`` steps' batches passed over; ``save``: both written there
    after the steps (every rank makes them, rank 0 writes)."""
    if device != "cpu":
        data_parallel(process_group, torch.device(device))
    torch.manual_seed(0)
    model = Net()
    optimizer = make_optimizer(model, groups=True)
    memory = CpuMemory(gpu_budget=budget)
    fields = ({"bucket_bytes": BUCKET_BYTES, "max_grad_norm": max_grad_norm}
              if strategy == "host_optimizer" else {})
    memory.attach(model, optimizer, offload_named(strategy, micro_batches=micro_batches,
                                                  **fields), process_group=process_group)
    if resume is not None:
        saved = torch.load(resume)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    generator = torch.Generator().manual_seed(1)
    for _ in range(skip * micro_batches):
        torch.randint(VOCAB, (ROWS, LENGTH), generator=generator)
    losses = []
    for _ in range(steps):
        total = 0.0
        for _ in range(micro_batches):
            batch = torch.randint(VOCAB, (ROWS, LENGTH), generator=generator)
            with memory.activations():
                mine = batch.chunk(world)[rank]
                loss = torch.stack([model(row) for row in mine]).mean() / micro_batches
                loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    if save is not None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if rank == 0:
            torch.save(state, save)
    stats = memory.stats()["offload"]
    memory.close()
    return losses, stats, [p.detach().clone() for p in model.parameters()]


def main(config_path: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # four ranks share two cores
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    refused = False
    try:
        results = []
        for case in json.loads(Path(config_path).read_text())["cases"]:
            budget = BUDGET + rank * case.pop("budget_step", 0)
            try:
                losses, stats, params = train(world, rank, budget=budget, **case)
            except HpcmemError as error:
                print(f"error: {error}", file=sys.stderr)
                refused = True
                continue
            mean = torch.tensor(losses, dtype=torch.float64)
            dist.all_reduce(mean)
            results.append({"losses": (mean / world).tolist(), "stats": stats,
                            "params": params})
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    if refused:
        sys.exit(2)


if __name__ == "__main__":
    main(*sys.argv[1:])
