"""GPU training benchmark: policies interleaved, GPU budgets, FSDP2 CPU offload, in one process.

For each repeat every variant runs once, in order (interleaved, so drift in clocks or
temperature hits every variant alike):

* the ``--policies`` (``cuda``, ``um``, ``hpcmem``) through ``hpcmem.train.loop.train`` (the code
  ``hpcmem train`` runs), without a budget;
* for each of ``--budgets`` (fractions of the estimated footprint): ``--budget-policy`` with
  that ``gpu_budget`` (a budget strategy), its record carrying the bytes it moved,
  its peak GPU-resident bytes and its PCIe bound (the last ``cuda`` run's step time and the
  pinned-copy bandwidth measured in the same run);
* with ``--fsdp``: PyTorch FSDP2 ``fully_shard`` + ``CPUOffloadPolicy`` on this one GPU (a
  one-rank NCCL process group), and the same with ``save_on_cpu(pin_memory=True)`` around
  forward and backward (activations offloaded too), on the same model, data and timing.

Records (one per run) are rewritten atomically to ``--out`` after every run, so a run cut
short keeps what finished.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any

VARIANT_POLICIES = ("cuda", "um", "hpcmem")
FSDP = "fsdp2_cpu_offload"
FSDP_ACTIVATIONS = "fsdp2_cpu_offload_activations"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("transformer", "cnn"), required=True)
    parser.add_argument("--params", type=int, help="transformer parameter count")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-warmup", type=int, default=4,
                        help="warm-up steps of budget runs (probe, plan, tuning)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", default=",".join(VARIANT_POLICIES),
                        help="unconstrained policies, in order (a name may repeat)")
    parser.add_argument("--budgets", default="",
                        help="gpu_budget as fractions of the estimated footprint, e.g. 0.4,0.1")
    parser.add_argument("--budget-policy", default="hpcmem")
    parser.add_argument("--pinned-inputs", action="store_true",
                        help="batches in pinned host memory, staged by every policy")
    parser.add_argument("--fsdp", default="",
                        help="also run FSDP2 CPU offload: plain, activations (with "
                        "save_on_cpu), or both comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group", default="", help="name of this invocation in the records")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.model == "transformer" and not args.params:
        parser.error("--params: required for --model transformer")
    return args


def _point(args: argparse.Namespace, policy: str, budget: int | None):
    from hpcmem.train.models import DEFAULT_VOCAB
    from hpcmem.train.point import TrainPoint

    transformer = args.model == "transformer"
    return TrainPoint(
        model=args.model,
        params_requested=args.params if transformer else None,
        oversubscribe=None,
        batch=args.batch,
        seq_len=args.seq_len if transformer else None,
        vocab=DEFAULT_VOCAB if transformer else None,
        image_size=None if transformer else args.image_size,
        dtype=args.dtype,
        policy=policy,
        gpu_budget=budget,
        steps=args.steps,
        warmup=args.budget_warmup if budget else args.warmup,
        seed=args.seed,
        device="cuda:0",
    )


def _data(args: argparse.Namespace):
    from hpcmem.train.data import synthetic_data
    from hpcmem.train.models import CNN_CLASSES, DEFAULT_VOCAB

    return synthetic_data(
        args.model,
        batch=args.batch,
        seq_len=args.seq_len,
        vocab=DEFAULT_VOCAB,
        image_size=args.image_size,
        classes=CNN_CLASSES,
        seed=args.seed,
    )


def run_managed(args, shape, policy: str, budget: int | None, unconstrained_ms: float | None):
    """One run of ``hpcmem.train``'s loop under a UnifiedMemory policy; its record."""
    import torch

    from hpcmem.node import applied
    from hpcmem.train.benchmark import train_point
    from hpcmem.um import UnifiedMemory

    device = torch.device("cuda", 0)
    memory = UnifiedMemory(policy, device=0, gpu_budget=budget)
    torch.cuda.reset_peak_memory_stats(device)
    return train_point(_point(args, policy, budget), shape, _data(args), memory, device=device,
                       binding=applied.current(), unconstrained_ms=unconstrained_ms,
                       pinned_inputs=args.pinned_inputs)


def run_fsdp(args, shape, offload_activations: bool) -> dict[str, Any]:
    """FSDP2 ``fully_shard`` with ``CPUOffloadPolicy`` on one GPU: same model, data, timing;
    with ``offload_activations``, forward and backward run under ``save_on_cpu``."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from hpcmem.node import applied
    from hpcmem.record.provenance import common_fields
    from hpcmem.train.benchmark import environment
    from hpcmem.train.loop import LEARNING_RATE, step_stats
    from hpcmem.train.networks import build
    from hpcmem.train.spec import TRAIN

    device = torch.device("cuda", 0)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = build(shape)
    offload = CPUOffloadPolicy()
    for block in getattr(model, "blocks", []):
        fully_shard(block, offload_policy=offload)
    fully_shard(model, offload_policy=offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    data = _data(args)
    staging = {
        f.name: torch.empty(f.shape, dtype=getattr(torch, f.dtype), pin_memory=True)
        for f in data.fields()
    }
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    saved = (
        (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True))
        if offload_activations else contextlib.nullcontext
    )
    torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for _ in range(args.warmup + args.steps):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        data.fill(staging)
        batch = {name: t.to(device, non_blocking=True) for name, t in staging.items()}
        with saved():
            with autocast:
                loss = model(batch)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    stats = step_stats(times[args.warmup :])
    name = FSDP_ACTIVATIONS if offload_activations else FSDP
    detail = "torch.distributed.fsdp.fully_shard + CPUOffloadPolicy(pin_memory=True), 1 rank"
    if offload_activations:
        detail += ", forward and backward under save_on_cpu(pin_memory=True)"
    record = {
        **common_fields(TRAIN, binding=applied.current()),
        "model": args.model,
        "params": shape.param_count(),
        "params_requested": args.params if args.model == "transformer" else None,
        "batch": args.batch,
        "seq_len": args.seq_len if args.model == "transformer" else None,
        "dtype": args.dtype,
        "policy": {"name": name, "allocator": "cuda",
                   "detail": detail + "; optimizer step on the CPU"},
        "gpu_budget": None,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms": {"median": stats.median, "p10": stats.p10, "p90": stats.p90},
        "first_step_ms": times[0],
        "step_ms_all": times,
        "throughput": data.items() / (stats.median / 1e3),
        "bytes_by_type": {"params": None, "activations": None, "inputs": None},
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "oversubscription": 0.0,
        "losses": {
            "first": [x.item() for x in losses[:5]],
            "last": [x.item() for x in losses[-5:]],
        },
        **environment(device),
    }
    del model, optimizer, batch, loss, losses
    return record


def _release() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def _line(label: str, tag: str, repeat: int, record: dict[str, Any], seconds: float) -> str:
    if record["status"] != "ok":
        return f"{label:18} {tag:26} rep {repeat}  {record['status']}: {record['reason']}"
    text = (f"{label:18} {tag:26} rep {repeat}  median {record['step_ms']['median']:9.2f} ms  "
            f"first {record['first_step_ms']:9.1f} ms")
    if "pcie_bound_ms" in record:
        text += (f"  bound {record['pcie_bound_ms']:8.1f} ms  h2d {record['bytes_h2d'] / 1e9:6.2f}"
                 f" GB  d2h {record['bytes_d2h'] / 1e9:6.2f} GB  peak "
                 f"{record['peak_gpu_resident_bytes'] / 2**30:6.2f} GiB")
    elif record.get("peak_reserved_bytes"):
        text += f"  peak {record['peak_reserved_bytes'] / 2**30:6.2f} GiB"
    return text + f"  escaped {record.get('escaped_bytes')}  ({seconds:.0f} s)"


def main() -> int:
    args = _args()
    if os.environ.get("HPCMEM_STREAM_LOG") == "1":  # one line per streamed step, on stderr
        logging.basicConfig(format="  %(message)s")
        logging.getLogger("hpcmem.um.streamed").setLevel(logging.INFO)
    import torch

    torch.cuda.init()  # memory statistics need an initialised CUDA context
    from hpcmem.record.jsonl import read_records, write_records
    from hpcmem.train.models import DEFAULT_VOCAB, cnn_shape, transformer_shape
    from hpcmem.train.sizing import footprint

    shape = (
        transformer_shape(args.params, args.seq_len, DEFAULT_VOCAB)
        if args.model == "transformer"
        else cnn_shape(None, args.image_size)
    )
    estimate = footprint(shape, args.batch, args.dtype).total
    variants: list[tuple[str, float | None]] = [(p, None) for p in args.policies.split(",") if p]
    fractions = [float(f) for f in args.budgets.split(",") if f]
    variants += [(args.budget_policy, fraction) for fraction in fractions]
    fsdp = {"plain": FSDP, "activations": FSDP_ACTIVATIONS}
    variants += [(fsdp[name], None) for name in args.fsdp.split(",") if name]
    label = f"{args.model}-{shape.param_count() / 1e9:.2f}B"
    print(f"# {label}: {shape}, batch {args.batch}, footprint estimate "
          f"{estimate / 2**30:.1f} GiB, budgets {fractions}", flush=True)
    records = read_records(args.out) if args.out.exists() else []
    cuda_ms: float | None = None
    for repeat in range(args.repeats):
        for sequence, (policy, fraction) in enumerate(variants):
            budget = int(estimate * fraction) if fraction else None
            started = time.perf_counter()
            try:
                if policy in (FSDP, FSDP_ACTIVATIONS):
                    record = run_fsdp(args, shape, policy == FSDP_ACTIVATIONS)
                else:
                    record = run_managed(args, shape, policy, budget, cuda_ms)
            except Exception:  # one broken variant must not cost the others their runs
                traceback.print_exc()
                _release()
                continue
            _release()
            if policy == "cuda" and record["status"] == "ok":
                cuda_ms = record["step_ms"]["median"]
            record.update(group=args.group, repeat=repeat, sequence=sequence,
                          budget_fraction=fraction,
                          footprint_estimate_bytes=estimate, command="benchmarks/gpu/run.sh")
            records.append(record)
            write_records(args.out, records)
            tag = record["policy"]["name"] + (f"@{fraction:g}" if fraction else "")
            print(_line(label, tag, repeat, record, time.perf_counter() - started), flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
