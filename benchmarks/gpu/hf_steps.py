"""The timed steps of ``hf_offload.py``: each step's micro-batches, forward and backward,
one optimizer step, timed to a device synchronisation."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from hf_models import batches

__all__ = ["plain_step", "step_ms", "timed"]


def step_ms(times: list[float], warmup: int) -> dict[str, float] | None:
    """The record's ``step_ms`` of the steps after ``warmup``: median, mean (total time
    over them), min and max; None where none was timed."""
    timed_steps = times[warmup:]
    if not timed_steps:
        return None
    return {"median": statistics.median(timed_steps), "mean": statistics.fmean(timed_steps),
            "min": min(timed_steps), "max": max(timed_steps)}


def finite_losses(record: dict[str, Any]) -> dict[str, Any]:
    """What ``record`` becomes where a loss was not finite: failed, saying from which step,
    its losses those before it; nothing where every loss is finite."""
    losses = record.get("losses") or []
    bad = [step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)]
    if not bad:
        return {}
    return {"status": "failed", "losses": losses[:bad[0] - 1],
            "reason": f"the loss was not finite (NaN or inf) from step {bad[0]} of "
                      f"{len(losses)}: it did not train"}


def _to_gpu(batch: Any) -> Any:
    return batch.to("cuda", non_blocking=True)


ALLOCATOR_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")


def timed(args: argparse.Namespace, step, vocab: int, stage=_to_gpu, warmed=None
          ) -> dict[str, Any]:
    """``warmup + steps`` calls of ``step(micro_batches)``, each a list of ``accumulate``
    staged batches: their wall-clock ms (``times``), ``losses`` and what PyTorch's allocator
    did in the timed steps (``allocator``); ``warmed()`` runs after the warm-up. Each rank of
    a data-parallel run trains on its own tokens. With ``--trace``, one more step runs under
    the profiler."""
    import torch

    times, losses = [], []
    rank = args.launch.rank if args.launch is not None else 0
    source = batches(args.batch, args.seq_len, args.accumulate, vocab, rank)
    counts = {}

    def one_step() -> None:
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step([stage(next(source)) for _ in range(args.accumulate)])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(float(loss))

    for index in range(args.warmup + args.steps):
        one_step()
        if index + 1 == args.warmup:
            if warmed is not None:
                warmed()
            counts = {k: torch.cuda.memory_stats().get(k, 0) for k in ALLOCATOR_COUNTS}
    allocator = {k: torch.cuda.memory_stats().get(k, 0) - v for k, v in counts.items()}
    if args.trace is not None:
        _profiled(one_step, args.trace)
        times.pop()  # the profiled step is slower: not one of the timed ones
    return {"times": times, "losses": losses, "allocator": allocator}


def _profiled(one_step: Callable[[], None], path: Path) -> None:
    """Run ``one_step`` under torch.profiler (CPU and CUDA) and write its Chrome trace."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        one_step()
    plain = path.with_suffix("")
    profiler.export_chrome_trace(str(plain))
    with plain.open("rb") as source, gzip.open(path, "wb") as target:
        shutil.copyfileobj(source, target)
    plain.unlink()


def plain_step(model: Any, optimizer: Any,
               scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
               autocast: bool = True,
               no_sync: Callable[[], AbstractContextManager[Any]] | None = None) -> Any:
    """One training step of a causal LM over its micro-batches, bf16-autocast unless
    ``autocast`` is off (FSDP2 casts the parameters itself), each forward and backward inside
    ``scope`` (hpcmem's activations scope; nothing for the plain run) and, but for the last
    micro-batch, ``no_sync`` (DDP's: its gradients are reduced once a step), each loss
    scaled by its share; one optimizer step. Returns the mean loss."""
    import torch

    def step(micro_batches):
        total = 0.0
        for index, ids in enumerate(micro_batches):
            last = index + 1 == len(micro_batches)
            with nullcontext() if no_sync is None or last else no_sync(), scope():
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    loss = model(input_ids=ids, labels=ids).loss / len(micro_batches)
                loss.backward()
            total = loss.detach() + total
        optimizer.step()
        optimizer.zero_grad()
        return total

    return step
