"""One bucket's CPU optimizer step: hpcmem's native Adam beside what a user would run instead.

Run ``python benchmarks/host_adam.py`` (``--elements``, ``--repeats``, ``--threads``). Each
variant steps AdamW (weight decay 0.01) over the same number of elements on all the job's
CPUs, in rotating order, ``--repeats`` rounds; the figure is the median:

- ``deepspeed``: DeepSpeed's CPU Adam (``DeepSpeedCPUAdam``, ZeRO-Offload's kernel) on fp32
  weights and gradients, where DeepSpeed is importable (it is never a dependency);
- ``torch-fused``: PyTorch's fused CPU AdamW, fp32 gradient in, fp32 master out (the casts on
  the GPU): hpcmem's host step before its native kernel;
- ``torch-host-casts``: the same with the bf16 gradient widened and the weights narrowed on
  the host by PyTorch;
- ``hpcmem-fp32``: hpcmem's kernel, fp32 gradient, no weights written;
- ``hpcmem-bf16``: hpcmem's kernel, bf16 gradient in and bf16 weights out in the same pass;
- ``hpcmem-bf16-state``: the same with both moments kept in bf16, rounded stochastically
  (``HostOptimizerOffload(state_dtype="bfloat16")``).

Each row gives the step's milliseconds, the bytes of host memory it moves per element and
the rate that makes, and its time against ``deepspeed`` (or ``torch-fused`` without it).
Results go to ``benchmarks/results/host_adam-<date>.{json,md}`` (``--out-dir``) with the
date, machine, commit and exact command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from provenance import header_lines, run_facts, write_result

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: Host memory bytes each variant reads and writes per element in one step.
BYTES = {"deepspeed": 28, "torch-fused": 28, "torch-host-casts": 40, "hpcmem-fp32": 28,
         "hpcmem-bf16": 28, "hpcmem-bf16-state": 20}
DECAY = 0.01


def variants(numel: int, threads: int) -> dict[str, Callable[[], None]]:
    """A step function per variant, each on buffers of its own."""
    import torch

    from hpcmem.um.host_optimizer.kernel import NativeAdam

    generator = torch.Generator().manual_seed(0)
    grad32 = torch.randn(numel, generator=generator) * 1e-3
    grad16 = grad32.to(torch.bfloat16)

    def fresh() -> torch.Tensor:
        return torch.randn(numel, generator=generator)

    steps: dict[str, Callable[[], None]] = {}
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError:
        DeepSpeedCPUAdam = None
    if DeepSpeedCPUAdam is not None:
        weights = torch.nn.Parameter(fresh())
        weights.grad = grad32.clone()
        deepspeed = DeepSpeedCPUAdam([weights], lr=1e-3, weight_decay=DECAY, adamw_mode=True)
        steps["deepspeed"] = deepspeed.step

    master = fresh()
    master.grad = grad32.clone()
    fused = torch.optim.AdamW([master], lr=1e-3, weight_decay=DECAY, fused=True)
    steps["torch-fused"] = fused.step

    cast_master = fresh()
    cast_master.grad = torch.empty(numel)
    cast_out = torch.empty(numel, dtype=torch.bfloat16)
    casting = torch.optim.AdamW([cast_master], lr=1e-3, weight_decay=DECAY, fused=True)

    def host_casts() -> None:
        cast_master.grad.copy_(grad16)
        casting.step()
        cast_out.copy_(cast_master)

    steps["torch-host-casts"] = host_casts
    for name, dtype, grad, state in (
            ("hpcmem-fp32", torch.float32, grad32, torch.float32),
            ("hpcmem-bf16", torch.bfloat16, grad16, torch.float32),
            ("hpcmem-bf16-state", torch.bfloat16, grad16, torch.bfloat16)):
        kernel = NativeAdam(dtype, threads=threads, state_dtype=state)
        own = fresh()
        holder = torch.optim.AdamW([own], lr=1e-3, weight_decay=DECAY, fused=True)
        out = None if kernel.out_dtype is None else torch.empty(numel, dtype=dtype)
        steps[name] = (lambda k=kernel, h=holder, m=own, g=grad, o=out: k.step(h, m, g, o))
    return steps


def measure(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds per step of each variant: one warm-up, then ``repeats`` rotating rounds."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    with torch.no_grad():
        for step in steps.values():
            step()
        for round_ in range(repeats):
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:
                start = time.perf_counter()
                steps[name]()
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def summarise(times: dict[str, list[float]], numel: int) -> list[dict]:
    """Median, host memory rate and ratio against the strongest baseline, per variant."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = "deepspeed" if "deepspeed" in medians else "torch-fused"
    return [{"variant": name, "median_ms": round(ms, 2),
             "bytes_per_element": BYTES[name],
             "host_gb_per_s": round(BYTES[name] * numel / ms / 1e6, 1),
             f"time_vs_{baseline}": round(ms / medians[baseline], 3),
             "repeats_ms": [round(t, 2) for t in times[name]]}
            for name, ms in medians.items()]


def markdown(result: dict) -> str:
    """The result as a Markdown table with its provenance."""
    rows = result["rows"]
    ratio = next(k for k in rows[0] if k.startswith("time_vs_"))
    lines = [f"# One bucket's CPU AdamW step, {result['elements']} elements", "",
             *header_lines(result),
             f"- Threads: {result['threads']}; instruction set: {result['isa']}; "
             f"{result['repeats']} rotating rounds, medians", "",
             f"| variant | ms | bytes/element | GB/s | {ratio.replace('_', ' ')} |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_ms']} | {r['bytes_per_element']} | "
              f"{r['host_gb_per_s']} | {r[ratio]} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=64 * 2**20,
                        help="elements per step (default 64 Mi: a 128 MiB bf16 bucket)")
    parser.add_argument("--repeats", type=int, default=15, help="rotating rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for every variant (default: the job's CPUs)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.elements < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--elements, --repeats and --threads: at least 1")
    import torch
    from hpcmem._optim import instruction_sets

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    steps = variants(args.elements, args.threads)
    times = measure(steps, args.repeats)
    result = {**run_facts("benchmarks/host_adam.py", load_before),
              "elements": args.elements, "threads": args.threads,
              "isa": instruction_sets()[0], "repeats": args.repeats,
              "torch": torch.__version__, "rows": summarise(times, args.elements)}
    stem = write_result(args.out_dir, "host_adam", result, markdown(result))
    print(markdown(result))
    print(f"written: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
