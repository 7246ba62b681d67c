"""Hugging Face causal LMs beyond the GPU: hpcmem's budget against DeepSpeed and FSDP2 offload.

One variant per process (``--variant``), so nothing one leaves (allocator caches, the CUDA
context, DeepSpeed's process group) reaches the next; ``run.sh``'s ``hf-offload`` group
interleaves them. The model is built from a ``transformers`` config with random weights
(nothing is downloaded); every variant trains it on the same random tokens with AdamW
(lr 1e-4, weight decay 0.01) for ``--warmup`` + ``--steps`` steps, each step timed to a
device synchronisation:

* ``cuda``: the model on the GPU, fused AdamW, bf16 autocast: the unconstrained step;
* ``deepspeed``: ZeRO stage 2 with ``offload_optimizer: cpu`` (DeepSpeedCPUAdam), bf16,
  with Hugging Face gradient checkpointing (``--checkpointing``, on by default);
* ``deepspeed3``: ZeRO stage 3 with ``offload_param`` and ``offload_optimizer: cpu`` (pinned),
  otherwise as ``deepspeed``: the parameters too live on the host between uses;
* ``fsdp2``: PyTorch FSDP2 on a one-rank process group, ``fully_shard`` on every transformer
  block, then the root, with ``CPUOffloadPolicy(pin_memory=True)`` and bf16 parameters
  (``MixedPrecisionPolicy``, fp32 reduction), ``torch.optim.AdamW`` stepping the host's
  parameters, with Hugging Face gradient checkpointing (on by default);
* ``zenflow``: DeepSpeed ZenFlow, as its tutorial configures it: ZeRO stage 2 with
  ``offload_optimizer: cpu`` (pinned) and ``zero_optimization.zenflow`` (``ZENFLOW``: the top
  5% of gradient columns stepped on the GPU at once, the rest accumulated and stepped by the
  CPU every 4 steps, overlapped with the next ones), bf16, Hugging Face gradient
  checkpointing. Its update is delayed, not exact; DeepSpeed takes its gradient accumulation
  from ``update_interval``, so it runs one micro-batch per step (``--accumulate 1``);
  ``--zenflow-pt-cores`` is its ``pt_reserved_cores_perc`` (the share of the cores kept for
  the training process; DeepSpeed's default where unset);
* ``torchao``: the model and its fp32 parameters on the GPU, bf16 autocast, torchao's
  ``CPUOffloadOptimizer`` wrapping fused CPU AdamW (``torch.optim.AdamW, fused=True``),
  ``offload_gradients=True`` as its documentation recommends (False with ``--accumulate``
  above 1, which it does not support), Hugging Face gradient checkpointing;
* ``megatrain``: MegaTrain's ``CPUMasterModel`` (``hf_megatrain``, its sources from
  ``HPCMEM_MEGATRAIN_DIR``) as its own ``train.py`` drives it, its defaults kept: the
  parameters bf16 on the host, the layers streamed to the GPU one at a time and recomputed
  from every 4th layer's activation, the loss in chunks of 128 positions, DeepSpeed's CPU
  Adam stepping the host's parameters; one process. A model it cannot run whole (a final
  norm or position embeddings it does not find) fails, saying what it leaves out;
* ``hpcmem``: the model built on the host, ``UnifiedMemory("hpcmem", gpu_budget=B)`` and
  ``attach(model, optimizer, offload=Offload(working_dtype="bfloat16"))``, bf16 autocast.
  ``--budget-from deepspeed`` takes B from the last DeepSpeed record in ``--out`` run with
  its default checkpointing: what ZeRO-Offload reserved (``deepspeed-nockpt``: its run
  without checkpointing; any variant's name works the same way), ``--budget-scale`` a share
  of it (``--budget-from cuda --budget-scale 0.3``: 30% of what the unconstrained run held).

Each process appends one record to ``--out`` (JSON lines): the median and mean step (the
mean spans ZenFlow's update cycles where the timed steps are a multiple of its interval),
PyTorch's peak allocated and reserved bytes, NVML's per-process peak, the process's peak
resident host memory (``host_peak_bytes``, pinned buffers included), the losses (a run
whose loss was not finite is failed, naming the step), and for hpcmem the strategy's
per-step accounting.

**Data parallel.** Under ``torchrun --nproc-per-node N ... --world-size N`` (or ``srun``,
``hf_ranks``) each variant runs one rank per GPU, ``--batch`` sequences per GPU per
micro-batch, each rank on its own tokens: ``cuda`` in DDP, ``deepspeed``, ``deepspeed3``
and ``zenflow`` over ``deepspeed.initialize``'s ranks, ``fsdp2`` sharded over the ranks,
``hpcmem`` data-parallel over the default NCCL group at ``gpu_budget`` per GPU
(``--budget-from deepspeed,zenflow``: the least either reserved on its least-reserving
rank). Rank 0 alone writes the record, every rank's merged into it (``hf_ranks.merge``):
``world_size``, each step on its slowest rank, the peaks of the rank that held most, the
ranks over the budget, tokens/s over all ranks, the loss averaged over the ranks and each
rank's own figures (``ranks``). Without ``WORLD_SIZE`` or ``--world-size`` it is one
process and its record is as above. ``run.sh``'s ``hf-offload-dp`` group runs the matrix
in one call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, loaded as a file too
from hf_models import MODELS, build
from hf_ranks import (
    gather,
    host_peak_bytes,
    launch_of,
    least_reserved,
    merge,
    nvml_index,
    refused_parallel,
    start,
    stop,
)
from hf_runners import ZENFLOW, ZERO, run, torchao_settings, zero_config
from hf_steps import finite_losses, step_ms

from hpcmem.peers.variants import CHECKPOINTED, VARIANTS

__all__ = ["CHECKPOINTED", "MODELS", "VARIANTS", "ZENFLOW", "ZERO", "main", "refused",
           "torchao_settings", "zero_config"]


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-large")
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step (gradient accumulation)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="bf16: autocast and bf16 working weights; fp32: neither "
                             "(cuda and hpcmem only)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=4,
                        help="untimed steps first (hpcmem plans after its fourth)")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="Hugging Face gradient checkpointing (default: on for "
                             f"{', '.join(CHECKPOINTED)})")
    parser.add_argument("--budget-gib", type=float, default=None)
    parser.add_argument("--budget-from", default=None,
                        help="take the budget from the last ok record of this variant in "
                             "--out, run with that variant's default --checkpointing "
                             "(NAME-nockpt: run without it) on as many GPUs; NAME,NAME: "
                             "the least of theirs")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="the share of --budget-from's bytes to take (default: 1)")
    parser.add_argument("--strategy", choices=("host_optimizer", "streamed"), default=None,
                        help="hpcmem: the budget strategy (default: the plan's)")
    parser.add_argument("--host-threads", type=int, default=None,
                        help="hpcmem: the host optimizer's CPU threads (default: planned)")
    parser.add_argument("--gpu-share", type=float, default=None,
                        help="hpcmem: share of the optimizer's elements the GPU steps "
                             "(default: planned)")
    parser.add_argument("--host-kernel", choices=("native", "torch"), default=None,
                        help="hpcmem: the host optimizer's kernel (default: native where "
                             "it applies)")
    parser.add_argument("--delayed-update", action="store_true",
                        help="hpcmem: ZeRO-Offload's one-step delayed parameter update from "
                             "the fifth step on")
    parser.add_argument("--state-dtype", choices=("float32", "bfloat16"), default=None,
                        help="hpcmem: the dtype of Adam's moments in host memory (bfloat16: "
                             "rounded stochastically; default: fp32)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="profile one more step after the timed ones into this "
                             "Chrome trace (.json.gz); benchmarks/gpu/trace_gaps.py reads it")
    parser.add_argument("--zenflow-pt-cores", type=float, default=None,
                        help="zenflow: pt_reserved_cores_perc, the share of the cores kept "
                             "for the training process (default: DeepSpeed's)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="data parallel: the ranks torchrun or srun started (refused "
                             "where they started another number, or none)")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.world_size is not None and args.world_size < 1:
        parser.error(f"--world-size {args.world_size}: a whole number, at least 1, is accepted")
    try:
        args.launch = launch_of(args.world_size, os.environ)
    except ValueError as error:
        parser.error(str(error))
    problem = refused(args)
    if problem:
        parser.error(problem)
    return args


def refused(args: argparse.Namespace) -> str | None:
    """Why ``args`` cannot run, or None: said before torch is imported."""
    if args.variant == "hpcmem" and not (args.budget_gib or args.budget_from):
        return "--variant hpcmem needs --budget-gib or --budget-from"
    for name in ("strategy", "state_dtype"):
        if getattr(args, name) is not None and args.variant != "hpcmem":
            return (f"--{name.replace('_', '-')} runs with the variant hpcmem, "
                    f"not {args.variant}")
    if args.variant == "megatrain" and args.checkpointing:
        return ("--checkpointing runs without megatrain: MegaTrain recomputes the layers "
                "itself (every checkpoint_interval layers); --no-checkpointing or none is "
                "accepted")
    if args.dtype != "bf16" and args.variant not in ("cuda", "hpcmem"):
        return (f"--dtype {args.dtype} runs with the variants cuda and hpcmem, "
                f"not {args.variant}")
    if args.variant == "zenflow" and args.accumulate != 1:
        return ("--accumulate runs with zenflow at 1 only: DeepSpeed takes ZenFlow's gradient "
                f"accumulation from its update_interval ({ZENFLOW['update_interval']})")
    if args.launch is not None:
        problem = refused_parallel(args.variant, args.launch, trace=args.trace is not None,
                                   delayed_update=args.delayed_update, gpu_share=args.gpu_share)
        if problem:
            return problem
    if args.zenflow_pt_cores is not None:
        if args.variant != "zenflow":
            return f"--zenflow-pt-cores runs with the variant zenflow, not {args.variant}"
        if not 0 < args.zenflow_pt_cores < 1:
            return (f"--zenflow-pt-cores {args.zenflow_pt_cores:g}: a share above 0 and "
                    "below 1 is accepted")
    return None


def _reserved(records: list[dict[str, Any]], name: str, args: argparse.Namespace,
              world: int) -> int | None:
    """What the last ok record of the variant ``name`` (``NAME-nockpt``: run without its
    default checkpointing) at this work (model, batch, accumulation, dtype) on ``world`` GPUs
    reserved, on its least-reserving
    rank; None where there is none."""
    variant = name.removesuffix("-nockpt")
    checkpointing = variant in CHECKPOINTED and variant == name
    held = [least_reserved(r) for r in records
            if r.get("variant") == variant and r.get("status") == "ok"
            and r.get("model") == args.model
            and r.get("checkpointing") == checkpointing
            and r.get("accumulate", 1) == args.accumulate
            and r.get("batch", 8) == args.batch and r.get("seq_len", 1024) == args.seq_len
            and r.get("dtype", "bf16") == args.dtype
            and r.get("world_size", 1) == world]
    return next((b for b in reversed(held) if b is not None), None)


def _budget(args: argparse.Namespace) -> int | None:
    if args.budget_from and args.out.exists():
        records = [json.loads(line) for line in args.out.read_text().splitlines() if line]
        world = args.launch.world_size if args.launch is not None else 1
        held = [b for name in args.budget_from.split(",")
                if (b := _reserved(records, name, args, world)) is not None]
        if held:
            return int(args.budget_scale * min(held))
    return int(args.budget_gib * 2**30) if args.budget_gib else None


def main() -> int:
    args = _args()
    if args.checkpointing is None:
        args.checkpointing = args.variant in CHECKPOINTED
    import torch
    import transformers

    from hpcmem.um.nvml import NvmlPeak

    launch = args.launch
    device, results_group = 0, None
    if launch is not None:
        cuda, results_group = start(launch)
        device = cuda.index
    budget = _budget(args) if args.variant == "hpcmem" else None
    command = " ".join(["benchmarks/gpu/hf_offload.py", *sys.argv[1:]])
    record: dict[str, Any] = {
        "variant": args.variant, "model": args.model, "batch": args.batch,
        "accumulate": args.accumulate, "steps": args.warmup + args.steps, "dtype": args.dtype,
        "seq_len": args.seq_len, "checkpointing": args.checkpointing, "gpu_budget": budget,
        "repeat": args.repeat, "git": os.environ.get("HPCMEM_GIT_SHA"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command if launch is None else f"{launch.command()} {command}",
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    started = time.perf_counter()
    managed = None
    if args.variant == "hpcmem":
        from hpcmem.um.native import load_native

        managed = load_native().gpu_bytes
    with NvmlPeak(device if launch is None else nvml_index(device), managed=managed) as nvml:
        try:
            torch.cuda.init()
            record["gpu"] = torch.cuda.get_device_name(device)
            model = build(args.model)
            record["params"] = sum(p.numel() for p in model.parameters())
            if args.variant == "hpcmem" and budget is None:  # a peer that failed, or none ran
                raise LookupError(
                    f"--budget-from {args.budget_from}: no ok record of it at this work "
                    f"({args.model}, {args.batch} x {args.seq_len} tokens, {args.accumulate} "
                    f"micro-batches, {args.dtype}) in {args.out.name}, and no --budget-gib")
            result = run(args, model, budget)
            record["status"] = "ok"
        except Exception as error:  # the record says why; the driver goes on
            traceback.print_exc()
            record.update(status="failed", reason=f"{type(error).__name__}: {error}"[:2000],
                          budget_minimum_bytes=getattr(error, "minimum", None))
            result = {}
    times = result.pop("times", [])
    record.update(result)
    record.update(finite_losses(record))
    own = {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
           "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
           "nvml_peak_bytes": nvml.process_bytes, "nvml_device_peak_bytes": nvml.device_bytes,
           "held_peak_bytes": nvml.held_bytes, "host_peak_bytes": host_peak_bytes()}
    if launch is not None:  # every rank's figures to rank 0, which alone writes
        every = gather({"rank": launch.rank, "status": record["status"],
                        "reason": record.get("reason"), "times": times,
                        "losses": record.get("losses"), **own}, results_group)
        stop()
        if launch.rank != 0:
            return 0 if record["status"] == "ok" else 1
        merged = merge(every, warmup=args.warmup, budget=budget,
                       tokens_per_step=args.batch * args.seq_len * args.accumulate)
        times = merged.pop("step_ms_all")
        record.update(merged)
        own = {"nvml_device_peak_bytes": own["nvml_device_peak_bytes"]}  # rank 0's device
    timing = step_ms(times, args.warmup)
    if timing is not None:
        record["step_ms"] = timing
    record.update(step_ms_all=times, seconds=time.perf_counter() - started, **own)
    with args.out.open("a") as handle:
        handle.write(json.dumps(record, allow_nan=False) + "\n")
    gib = 2**30
    gpus = f" on {launch.world_size} GPUs" if launch is not None else ""
    print(f"{args.model} {args.variant:9}{gpus} rep {args.repeat} {record['status']}: median "
          f"{record.get('step_ms', {}).get('median', float('nan')):.1f} ms, allocated "
          f"{record['peak_allocated_bytes'] / gib:.2f} GiB, reserved "
          f"{record['peak_reserved_bytes'] / gib:.2f} GiB, NVML "
          f"{(record['nvml_peak_bytes'] or 0) / gib:.2f} GiB, held "
          f"{(record['held_peak_bytes'] or 0) / gib:.2f} GiB, budget "
          f"{(budget or 0) / gib:.2f} GiB", flush=True)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
