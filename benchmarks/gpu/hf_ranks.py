"""Data parallelism for ``hf_offload.py``: the ranks a launcher started, what they may run,
and one record merged from theirs.

``torchrun --nproc-per-node N benchmarks/gpu/hf_offload.py --world-size N ...`` starts one
rank per GPU (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in
the environment); under ``srun`` with ``--world-size`` the ranks come from Slurm's
``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_NTASKS`` (``MASTER_ADDR`` and
``MASTER_PORT`` exported by the job). Each rank initialises the default NCCL group on its
GPU, trains on its own tokens (the batch is per GPU) and, at the end, hands its result to
rank 0 over a gloo group (:func:`gather`); rank 0 alone writes the record, :func:`merge`'s
fields in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hf_steps import step_ms

from hpcmem.train.ranks import (
    Launch,
    gather,
    host_peak_bytes,
    largest,
    launch_of,
    mean_steps,
    slowest_steps,
    start,
    stop,
)

__all__ = ["PEAKS", "Launch", "gather", "host_peak_bytes", "launch_of", "least_reserved",
           "merge", "nvml_index", "refused_parallel", "start", "stop"]

#: a rank's memory peaks: PyTorch's, NVML's, with hpcmem's managed bytes, and its host RSS
PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes", "nvml_peak_bytes", "held_peak_bytes",
         "host_peak_bytes")
#: the variants that run one process only, and why
ONE_PROCESS = {"torchao": "torchao's CPUOffloadOptimizer steps one process's parameters, "
                          "with no data-parallel form",
               "megatrain": "MegaTrain's data parallelism is its own (GPU workers spawned by "
                            "one process), not the launcher's ranks; --world-size 1 or none "
                            "is accepted"}


def refused_parallel(variant: str, launch: Launch, *, trace: bool, delayed_update: bool,
                     gpu_share: float | None) -> str | None:
    """Why ``variant`` cannot run over ``launch``'s ranks, or None."""
    if variant in ONE_PROCESS:
        return (f"--variant {variant} runs one process, not {launch.world_size} ranks: "
                f"{ONE_PROCESS[variant]}")
    if trace:
        return f"--trace profiles one process, not {launch.world_size} ranks"
    if launch.world_size > 1 and variant == "hpcmem":
        asked = "--delayed-update" if delayed_update else (
            "--gpu-share" if gpu_share is not None else None)
        if asked:
            return (f"{asked} runs with one rank, not {launch.world_size}: hpcmem's data "
                    "parallelism steps every shard on the host")
    return None


def nvml_index(device: int) -> int:
    """NVML's index of the CUDA device ``device`` (``CUDA_VISIBLE_DEVICES`` renumbers CUDA's,
    not NVML's); ``device`` itself where PyTorch cannot tell."""
    import torch

    try:
        return torch.cuda._get_nvml_device_index(device)
    except (AttributeError, RuntimeError):
        return device


def _over_budget(result: Mapping[str, Any], budget: int | None) -> bool:
    peaks = [result.get(name) for name in ("peak_reserved_bytes", "nvml_peak_bytes",
                                           "held_peak_bytes")]
    return budget is not None and any(p is not None and p > budget for p in peaks)


def merge(results: Sequence[Mapping[str, Any]], *, warmup: int, tokens_per_step: int,
          budget: int | None) -> dict[str, Any]:
    """One record's fields from every rank's result (``rank``, ``status``, ``reason``,
    ``times`` in ms, ``losses`` and :data:`PEAKS`), in rank order: ``world_size``; the
    status (failed where any rank failed, each failed rank's reason); ``step_ms_all``, each
    step's time on its slowest rank; ``losses``, each step's mean over the ranks (each its
    own tokens: the global batch's); each of :data:`PEAKS`, its largest over the ranks;
    ``tokens_per_s`` over all ranks on the mean timed step; ``budget_exceeded_ranks``, the
    ranks whose reserved, NVML or held peak passed ``budget``; and ``ranks``, each rank's
    own step and peaks."""
    failed = [r for r in results if r["status"] != "ok"]
    slowest = slowest_steps([r["times"] for r in results])
    losses = [r.get("losses") or [] for r in results]
    merged: dict[str, Any] = {
        "world_size": len(results), "status": "failed" if failed else "ok",
        "step_ms_all": slowest,
        "losses": (mean_steps(losses)
                   if losses and len({len(x) for x in losses}) == 1 and losses[0] else None),
        **{name: largest([r.get(name) for r in results]) for name in PEAKS},
        "budget_exceeded_ranks": [r["rank"] for r in results if _over_budget(r, budget)],
        "ranks": [{"rank": r["rank"], "status": r["status"],
                   "step_ms": step_ms(r["times"], warmup),
                   **{name: r.get(name) for name in PEAKS}} for r in results],
    }
    timed = step_ms(slowest, warmup)
    if timed is not None:
        merged["tokens_per_s"] = len(results) * tokens_per_step / timed["mean"] * 1e3
    if failed:
        merged["reason"] = "; ".join(f"rank {r['rank']}: {r.get('reason')}"
                                     for r in failed)[:2000]
    return merged


def least_reserved(record: Mapping[str, Any]) -> int | None:
    """The GPU memory a run reserved on its least-reserving rank (its own peak for a
    single process): a per-GPU budget no larger than it is no larger on any rank."""
    ranks = record.get("ranks")
    if isinstance(ranks, list) and ranks:
        held = [r["peak_reserved_bytes"] for r in ranks
                if r.get("peak_reserved_bytes") is not None]
        return min(held) if held else None
    return record.get("peak_reserved_bytes")
