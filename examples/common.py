"""What the examples share: their options, the exit without a GPU, the line they end with.

Each example prints, last, one JSON line: the loss of each optimizer step and what
``MemoryScopes.stats()`` said of the GPU memory (``tests/test_integrations_gpu.py`` reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from hpcmem.train.models import TransformerShape
from hpcmem.um import Offload, offload_named
from hpcmem.um.budget.offload import STRATEGIES
from hpcmem.units import parse_size

#: hpcmem's transformer (the plain loop, Lightning; GPT-2 of the same shape for ``Trainer``):
#: 23M parameters, 93 MB of fp32 weights
SHAPE = TransformerShape(n_layers=6, d_model=512, n_heads=8, seq_len=256, vocab=8192)
BATCH = 8


def options(description: str) -> argparse.Namespace:
    """The command line: policy, budget, offload strategy, steps, micro-batches."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="hpcmem",
                        help="cuda, um, hpcmem or a policy YAML file (default: hpcmem)")
    parser.add_argument("--gpu-budget", type=parse_size, metavar="BYTES",
                        help="GPU bytes for the whole job, e.g. 1G (default: no budget)")
    parser.add_argument("--offload", choices=STRATEGIES,
                        help="the budget's strategy (default: planned from the budget)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps (default: 8)")
    parser.add_argument("--micro-batches", type=int, default=2,
                        help="backward passes per optimizer step (default: 2)")
    args = parser.parse_args()
    if args.offload and args.gpu_budget is None:
        parser.error("--offload needs --gpu-budget")
    return args


def require_gpu(example: str) -> None:
    """Exit 0, saying so, on a machine without a CUDA GPU: the examples train on one."""
    if not torch.cuda.is_available():
        print(f"{example} needs a CUDA GPU (torch {torch.__version__} sees none): nothing run")
        sys.exit(0)


def offload(args: argparse.Namespace) -> Offload | None:
    """The budget's ``Offload`` (None without a budget): bf16 working weights."""
    if args.gpu_budget is None:
        return None
    return offload_named(args.offload, working_dtype="bfloat16",
                         micro_batches=args.micro_batches)


def token_rows(count: int) -> torch.Tensor:
    """``count`` rows of seeded random tokens, ``SHAPE.seq_len + 1`` each (the inputs and the
    next-token targets), in host memory."""
    return torch.randint(SHAPE.vocab, (count, SHAPE.seq_len + 1),
                         generator=torch.Generator().manual_seed(1))


def report(losses: list[float], stats: dict[str, Any]) -> None:
    """The closing JSON line."""
    offload = stats.get("offload") or {}
    print(json.dumps({
        "losses": losses,
        "policy": stats["policy"],
        "strategy": offload.get("strategy"),
        "gpu_budget_bytes": stats.get("gpu_budget_bytes"),
        "peak_gpu_resident_bytes": stats.get("peak_gpu_resident_bytes"),
        "escaped_bytes": stats["escaped_bytes"],
    }))
