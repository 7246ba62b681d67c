"""Train a randomly initialised model on synthetic data and time its steps.

Models: a decoder-only transformer language model sized by --params (125M to
tens of billions of parameters: depth, width and heads are derived from the
count, the actual count is reported), or a ResNet-50-like CNN whose large fp32
image batches make it the input-heavy case. Each step the CPU produces a batch
(as a data loader would) and hands it to the GPU through the policy's inputs
memory; AdamW updates the weights. Memory comes from the Unified Memory policy
given by --policy: `cuda` (PyTorch's own allocator, the ceiling), `um` (managed
memory without advice, the baseline) or `hpcmem` (the tuned per-type scheme),
or a policy YAML file.

Output: a summary on stdout and, with --output, one JSONL record (step time
median/p10/p90, first-step time, throughput, peak bytes per memory type, bytes
that escaped routing, losses). Without a CUDA GPU the command fails, or with
--skip-if-no-gpu writes a `skipped` record saying why.

Counts take decimal units (125M, 1.3B, 6B); byte sizes binary units (512M, 40G).
Exit status: 0 done (or skipped), 1 no GPU or out of memory (a `failed` record is
written), 2 bad option value, refused oversubscription, or an --output that cannot be
written (checked before training) or --delayed-update with a --gpu-budget too small
for the host optimizer, or --state-dtype bfloat16 where its native kernel is missing,
3 --gpu-budget below the least one step needs (measured by the first step; the `failed`
record and the message name the budget and that minimum, `budget_minimum_bytes`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpcmem.cli import UsageError, bad_input
from hpcmem.train.models import DEFAULT_VOCAB

#: Exit status when --gpu-budget is below what one step measurably needs.
EXIT_BUDGET_TOO_SMALL = 3

HELP = "train a transformer LM or CNN under a memory policy and time its steps"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem train``."""
    what = parser.add_argument_group("model")
    what.add_argument("--model", default="transformer", metavar="NAME",
                      help="transformer (decoder-only LM) or cnn (ResNet-50-like); "
                      "default: transformer")
    what.add_argument("--params", metavar="COUNT",
                      help="target parameter count (125M, 1.3B, 6B); the actual count is "
                      "reported; default: 125M for transformer, ResNet-50's 25.6M for cnn")
    what.add_argument("--batch", type=int, metavar="N",
                      help="samples per micro-batch (per step without --accumulate); "
                      "default: 8 sequences (transformer), 256 images (cnn)")
    what.add_argument("--accumulate", type=int, default=1, metavar="N",
                      help="micro-batches per optimizer step (gradient accumulation, as "
                      "gradient_accumulation_steps in Hugging Face); a step is N forward "
                      "and backward passes of --batch samples and one optimizer step; "
                      "default: 1")
    what.add_argument("--seq-len", type=int, metavar="TOKENS",
                      help="tokens per sequence (transformer); default: 2048")
    what.add_argument("--vocab", type=int, metavar="N",
                      help=f"vocabulary size (transformer); default: {DEFAULT_VOCAB}")
    what.add_argument("--image-size", type=int, metavar="PIXELS",
                      help="image height and width (cnn); default: 224")
    what.add_argument("--dtype", metavar="TYPE",
                      help="bf16 (autocast over fp32 weights) or fp32; default: bf16 "
                      "(transformer), fp32 (cnn)")

    memory = parser.add_argument_group("memory")
    memory.add_argument("--policy", default="hpcmem", metavar="NAME|FILE",
                        help="memory policy: cuda, um, hpcmem, or a policy YAML file; "
                        "default: hpcmem")
    memory.add_argument("--gpu-budget", metavar="BYTES",
                        help="GPU memory the whole job may hold, binary units (40G, 512M); "
                        "the rest lives on the host; default: no budget")
    memory.add_argument("--delayed-update", action="store_true",
                        help="under --gpu-budget, step the optimizer on the CPU while the next "
                        "forward and backward run, on weights one update behind "
                        "(ZeRO-Offload's delayed update; losses differ slightly); "
                        "default: every step updates before the next")
    memory.add_argument("--state-dtype", default="float32", metavar="TYPE",
                        help="under --gpu-budget, the dtype of Adam's moments in host memory: "
                        "float32, or bfloat16 (rounded stochastically: less host memory and "
                        "traffic; losses differ slightly); default: float32")
    memory.add_argument("--oversubscribe", type=float, metavar="RATIO",
                        help="size the model so its estimated footprint (weights, gradients, "
                        "AdamW state, activations) is RATIO x free GPU memory, instead of "
                        "--params; above 0.9 is refused before any allocation")
    memory.add_argument("--allow-oversubscription", action="store_true",
                        help="allow --oversubscribe above 0.9 and managed memory beyond free "
                        "GPU memory (dedicated nodes only: it can hang a shared GPU); "
                        "also HPCMEM_ALLOW_OVERSUBSCRIPTION=1")

    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=20, metavar="N",
                     help="timed steps after the warm-up; default: 20")
    run.add_argument("--warmup", type=int, default=3, metavar="N",
                     help="untimed steps first (the first step's time is still reported); "
                     "default: 3")
    run.add_argument("--seed", type=int, default=0, metavar="N",
                     help="seed of the weights and the synthetic data; default: 0")
    run.add_argument("--device", default="cuda:0", metavar="DEVICE",
                     help="cuda or cuda:N; cpu runs the loop with policy cuda only, for "
                     "tests (no GPU figures); default: cuda:0")
    run.add_argument("--world-size", type=int, metavar="N",
                     help="data parallel: the N ranks torchrun --nproc-per-node or srun "
                     "started (one GPU each, from LOCAL_RANK or SLURM_LOCALID; checked "
                     "against them); --batch is then the global micro-batch, split evenly "
                     "between the ranks, and rank 0 writes the record merged from all of "
                     "theirs; under torchrun it is read from WORLD_SIZE when left out; "
                     "default: one process")
    run.add_argument("--output", metavar="FILE",
                     help="write the JSONL record here (atomically); default: summary only")
    run.add_argument("--skip-if-no-gpu", action="store_true",
                     help="without a CUDA GPU, write a skipped record and exit 0 "
                     "instead of failing")


def _point(args: argparse.Namespace, world_size: int) -> Any:
    """The point the options describe and its loaded policy; UsageError names a bad option."""
    from hpcmem.train.point import PointError, check_policy, make_point
    from hpcmem.um import load_policy

    with bad_input(PointError):
        point = make_point(
            model=args.model, params=args.params, oversubscribe=args.oversubscribe,
            batch=args.batch, seq_len=args.seq_len, vocab=args.vocab,
            image_size=args.image_size, dtype=args.dtype, policy=args.policy,
            gpu_budget=args.gpu_budget, steps=args.steps, warmup=args.warmup, seed=args.seed,
            device=args.device, accumulate=args.accumulate,
            delayed_update=args.delayed_update, state_dtype=args.state_dtype,
            world_size=world_size,
        )
    with bad_input(OSError, ValueError, where="--policy"):
        policy = load_policy(point.policy)
    with bad_input(PointError):
        check_policy(point, policy)
    return point, policy


def run(args: argparse.Namespace) -> int:
    """Validate, refuse oversubscription, check the GPU, then train and record."""
    import os

    from hpcmem.outputs import OutputPathError, check_output_file, write_errors
    from hpcmem.train.ranks import launch_of
    from hpcmem.train.sizing import OversubscriptionRefusedError, check_oversubscribe
    from hpcmem.um import oversubscription_allowed

    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size: {args.world_size} is not a whole number >= 1")
    with bad_input(ValueError):
        launch = launch_of(args.world_size, os.environ)
    point, policy = _point(args, launch.world_size if launch else 1)
    writes = launch is None or launch.rank == 0  # rank 0 writes the merged record
    if args.output and writes:
        with bad_input(OutputPathError, where="--output"):
            check_output_file(args.output)
    with bad_input(ValueError):
        allowed = oversubscription_allowed(args.allow_oversubscription)
    if point.oversubscribe is not None:
        with bad_input(OversubscriptionRefusedError):
            check_oversubscribe(point.oversubscribe, allowed)

    from hpcmem.train.benchmark import NoGPUError, run_point
    from hpcmem.train.sizing import SizingError
    from hpcmem.um.errors import BudgetError

    try:
        # a BudgetError that is not a budget below the minimum (a failed record, exit 3):
        # --delayed-update or --state-dtype that the budget strategy cannot honour
        where = ("--delayed-update" if point.delayed_update
                 else "--state-dtype" if point.state_dtype != "float32" else "")
        with bad_input(SizingError), bad_input(BudgetError, where=where):
            record = run_point(point, policy=policy, allow_oversubscription=allowed,
                               skip_if_no_gpu=args.skip_if_no_gpu, launch=launch)
    except NoGPUError as error:
        print(f"hpcmem train: error: {error}", file=sys.stderr)
        return 1
    if args.output and writes:
        from hpcmem.record.jsonl import write_records

        with bad_input(OutputPathError, where="--output"), write_errors(args.output):
            write_records(args.output, [record])
    if writes:
        print(summary_line(record))
    if record["status"] != "failed":
        return 0
    return EXIT_BUDGET_TOO_SMALL if "budget_minimum_bytes" in record else 1


def summary_line(record: dict[str, Any]) -> str:
    """One human-readable line about a train record."""
    if record["status"] != "ok":
        return f"hpcmem train: {record['status']}: {record['reason']}"
    step = record["step_ms"]
    micro = record.get("accumulate", 1)
    accumulated = f" x {micro} micro-batches" if micro > 1 else ""
    ranks = record.get("world_size", 1)
    accumulated += f" over {ranks} ranks" if ranks > 1 else ""
    return (
        f"hpcmem train: {record['model']} {record['params'] / 1e6:.1f}M params, "
        f"policy {record['policy']['name']}, {record['dtype']}, batch {record['batch']}"
        f"{accumulated}: "
        f"step {step['median']:.1f} ms median (p10 {step['p10']:.1f}, p90 {step['p90']:.1f}), "
        f"first step {record['first_step_ms']:.1f} ms, "
        f"{record['throughput']:.1f} {record['throughput_unit']}"
    )
