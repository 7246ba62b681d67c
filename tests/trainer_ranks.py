"""One rank of the trainer integrations' data-parallel tests, started by a real ``torchrun``
(``conftest.torchrun``): gloo between the ranks, the CPU stand-in of ``UnifiedMemory``, each
rank half of the one-rank tests' batch (``PER_RANK``), so the global batch is theirs.

``python tests/trainer_ranks.py hf|lightning OUT``: the integration's cases (a budget, none,
the streamed strategy, which several ranks refuse); rank 0 writes ``OUT/results.json``:
per case the losses over the ranks (``losses``), the module the framework trained
(``trained``), or the one line a refused case raised (``refused``). A ``hf`` case trains
in ``OUT/<case>`` (its checkpoints); Lightning's ``resumed`` case saves in
``OUT/lightning-checkpoints``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from cpu_memory import CpuMemory

from hpcmem.errors import HpcmemError
from hpcmem.um import StreamedOffload, offload_named

PER_RANK = 2


def hf(out: Path) -> dict[str, Any]:
    """``UnifiedMemoryTrainer``'s cases (``Trainer`` logs the losses averaged over the ranks);
    the budget's run saves a checkpoint at step 2."""
    from test_integrations_hf import BUDGET, _train

    cases = {"budget": (CpuMemory(gpu_budget=BUDGET), None, {"save_strategy": "steps",
                                                             "save_steps": 2}),
             "none": (CpuMemory(), None, {}),
             "streamed": (CpuMemory(gpu_budget=BUDGET), StreamedOffload(), {})}
    results = {}
    for name, (memory, offload, settings) in cases.items():
        def run(memory=memory, offload=offload, settings=settings, name=name):
            losses, _, trainer = _train(out / name, memory, offload,
                                        per_device_train_batch_size=PER_RANK, **settings)
            return {"losses": losses, "trained": type(trainer.model_wrapped).__name__}
        results[name] = _refused_or(run)
    return results


def lightning(out: Path) -> dict[str, Any]:
    """``UnifiedMemoryStrategy``'s cases on ``devices=2`` (each rank's micro-batch losses,
    averaged here over the ranks)."""
    from test_integrations_lightning import BUDGET, _fit

    cases = {"budget": (CpuMemory(gpu_budget=BUDGET), offload_named("host_optimizer")),
             "none": (CpuMemory(), None),
             "streamed": (CpuMemory(gpu_budget=BUDGET), offload_named("streamed"))}
    results = {}
    for name, (memory, offload) in cases.items():
        def run(memory=memory, offload=offload):
            losses, _, strategy = _fit(memory, offload, batch_size=PER_RANK, devices=2)
            return {"losses": _mean(losses), "trained": strategy.lightning_module.trained}
        results[name] = _refused_or(run)
    results["resumed"] = {name: _resumed(out / "lightning-checkpoints" / name, budget)
                          for name, budget in (("budget", True), ("none", False))}
    return results


def _resumed(folder: Path, budget: bool) -> dict[str, Any]:
    """Under a budget or none (Lightning's DDP) on two ranks: a fit of three steps, one an
    epoch, saving after each (Lightning's ``ModelCheckpoint``), then a fit resumed from the
    first save; the losses of each over the ranks."""
    import lightning.pytorch as pl
    from test_integrations_lightning import (
        BUDGET,
        MICRO_BATCHES,
        LanguageModel,
        _one_step_an_epoch,
    )

    from hpcmem.integrations.lightning import UnifiedMemoryStrategy

    first = folder / "epoch=0-step=1.ckpt"

    def fit(resume: bool) -> list[float]:
        module = LanguageModel()
        saver = pl.callbacks.ModelCheckpoint(dirpath=folder, save_top_k=-1, every_n_epochs=1)
        trainer = pl.Trainer(
            accelerator="cpu", devices=2, max_steps=3, accumulate_grad_batches=MICRO_BATCHES,
            strategy=UnifiedMemoryStrategy(CpuMemory(gpu_budget=BUDGET),
                                           offload_named("host_optimizer")) if budget
            else "ddp",
            callbacks=[] if resume else [saver], enable_checkpointing=not resume,
            logger=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, _one_step_an_epoch(PER_RANK), ckpt_path=first if resume else None)
        return _mean(module.losses)

    return {"saving": fit(resume=False), "resumed": fit(resume=True)}


def _mean(losses: list[float]) -> list[float]:
    """Each micro-batch's loss averaged over the ranks."""
    mean = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean)
    return (mean / dist.get_world_size()).tolist()


def _refused_or(run) -> dict[str, Any]:
    try:
        return run()
    except HpcmemError as error:
        return {"refused": str(error)}


def main(framework: str, out: str) -> None:
    torch.set_num_threads(1)  # two ranks share two cores
    results = {"hf": hf, "lightning": lightning}[framework](Path(out))
    if dist.get_rank() == 0:
        (Path(out) / "results.json").write_text(json.dumps(results))
    # gloo's threads joined before exit: a group left to the interpreter's teardown may
    # abort a rank as it ends ("terminate called without an active exception")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
