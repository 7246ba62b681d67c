"""What the peers' records hold, declared once for the results pipeline.

A point is one variant of ``benchmarks/gpu/hf_offload.py`` (a peer tool, hpcmem under a
budget, or plain ``cuda``) training one work per step: model, dtype, batch, micro-batches
per step and sequence length. Its key reads
``peers/<model>/<dtype>/batch=<n>[/accum=<n>]/seq=<n>[/gpus=<n>]/<variant>/ckpt=<True|False>/budget=<bytes|none>``
(``gpus``: the ranks of a data-parallel run, one GPU each, where more than one; ``batch``
per GPU; the budget per GPU, to a hundredth of a GiB) followed, for hpcmem, by the Offload
settings asked for where set: ``share=`` (the GPU's share of the optimizer step),
``kernel=`` (the host optimizer's kernel), ``delayed=True``, ``state=bfloat16`` (Adam's
moments) and ``threads=``, and, for ZenFlow, ``ptcores=`` where its
``pt_reserved_cores_perc`` (the share of the cores kept for the training process) is set.
The median step time is checked in every run, the mean step (total time over the timed
steps) where the records have it, and so are hpcmem's step over the fastest ZeRO-Offload
run's at the same work (``vs_zero_offload``) and over the fastest peer tool's
(``vs_best_peer``), derived across the points by :func:`hpcmem.peers.tables.derive` on the
mean step where every run of the work timed it, else the median;
``config/references.yaml`` bounds both. A data-parallel point also has its tokens/s over
all ranks, its largest host memory per rank and its ``scaling_efficiency``: the same
variant's step on one GPU over its step on N (each GPU trains the same batch, so N times
the tokens in that step), derived across GPU counts by :func:`hpcmem.peers.tables.derive`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcmem.peers.record import ACCOUNTING, FLOOR, NAME, PEAKS, adopt
from hpcmem.peers.variants import VARIANTS
from hpcmem.record.spec import HIGHER, LOWER, NONNEGATIVE, Benchmark, Coordinate, Metric

__all__ = ["GIB", "LOSS_VS_CUDA", "PEERS", "SCALING", "VS_BEST", "VS_CUDA", "VS_ZERO"]

#: step time over the fastest ZeRO-Offload run's (``deepspeed``, with or without
#: checkpointing) at the same work, and over ``cuda``'s
VS_ZERO, VS_CUDA = "vs_zero_offload", "vs_cuda"
#: step time over the fastest peer tool's at the same work (:data:`variants.TOOLS
#: <hpcmem.peers.variants.TOOLS>`, whichever ran)
VS_BEST = "vs_best_peer"
#: the relative distance of the last step's loss from ``cuda``'s after as many steps
LOSS_VS_CUDA = "loss_vs_cuda"
#: a point's tokens/s on N GPUs over N times its tokens/s on one: its step on one GPU over
#: its step on N, each GPU training the same batch (weak scaling)
SCALING = "scaling_efficiency"
#: a figure some runs lack: a number at least 0, or null
NULLABLE = {"type": ["number", "null"], "minimum": 0}
GIB = 2**30
#: units of hpcmem's per-step accounting that are not bytes
UNITS = {"host_threads": "threads"}


def _offload(name: str, unset: Any, shown: Callable[[Any], Any] = str) -> Callable[[Any], Any]:
    """The reader of an Offload setting: ``shown(value)``, or ``unset`` where not set."""
    def read(record: Any) -> Any:
        offload = record.get("offload")
        value = offload.get(name) if isinstance(offload, dict) else None
        return unset if value is None else shown(value)
    return read


def _zenflow_cores(record: Any) -> Any:
    """ZenFlow's ``pt_reserved_cores_perc`` as its config set it ("auto": DeepSpeed's)."""
    zero = record.get("zero")
    zenflow = zero.get("zenflow") if isinstance(zero, dict) else None
    value = zenflow.get("pt_reserved_cores_perc") if isinstance(zenflow, dict) else None
    return "auto" if value is None else f"{value:g}"


def _budget(record: Any) -> int | None:
    """The GPU budget in bytes, to a hundredth of a GiB: budgets taken from another run's
    peak (``--budget-from``) differ by a few bytes from one run to the next."""
    budget = record.get("gpu_budget")
    return round(round(budget / GIB, 2) * GIB) if budget else None


def _ours(point: Any) -> bool:
    """hpcmem's own points: the ratio to a peer is checked for them."""
    return point["variant"] == "hpcmem"


PEERS = Benchmark(
    name=NAME,
    coordinates=(
        Coordinate("model"),
        Coordinate("dtype"),
        Coordinate("batch", "batch", integer=True),
        Coordinate("accumulate", "accum", integer=True, implied=1),
        Coordinate("seq_len", "seq", integer=True),
        # the ranks of a data-parallel run, one GPU each (1: a single process, as before)
        Coordinate("world_size", "gpus", integer=True, implied=1),
        Coordinate("variant"),
        Coordinate("checkpointing", "ckpt"),
        Coordinate("gpu_budget", "budget", missing="none", integer=True, nullable=True,
                   read=_budget),
        # hpcmem's Offload settings, where asked for ("auto": hpcmem's plan picks)
        Coordinate("gpu_share", "share", implied="auto",
                   read=_offload("gpu_share", "auto", lambda share: f"{share:g}")),
        Coordinate("host_kernel", "kernel", implied="auto", read=_offload("host_kernel", "auto")),
        Coordinate("delayed_update", "delayed", implied=False,
                   read=_offload("delayed_update", False, bool)),
        Coordinate("state_dtype", "state", implied="float32",
                   read=_offload("state_dtype", "float32")),
        Coordinate("threads", "threads", implied="auto", read=_offload("threads", "auto")),
        Coordinate("pt_cores", "ptcores", implied="auto", read=_zenflow_cores),
    ),
    metrics=(
        Metric("step_ms.median", "ms", LOWER, checked=True),
        # total time over the timed steps: records before it have only the median
        Metric("step_ms.mean", "ms", LOWER, checked=True, required=False),
        # derived across the points of one work (hpcmem.peers.tables.derive)
        Metric(VS_ZERO, "ratio", LOWER, checked=True, applies=_ours, required=False),
        Metric(VS_BEST, "ratio", LOWER, checked=True, applies=_ours, required=False),
        Metric(VS_CUDA, "ratio", LOWER, required=False),
        Metric(LOSS_VS_CUDA, "ratio", LOWER, required=False),
        Metric("final_loss", "loss", None, required=False, schema={"type": "number"}),
        Metric("loss_steps", "steps", None, required=False),
        *(Metric(name, "bytes", LOWER, required=False, schema=NULLABLE) for name in PEAKS),
        # data parallel: the largest resident host memory of a rank, tokens/s over all
        # ranks, and (derived across GPU counts) the scaling from one GPU
        Metric("host_peak_bytes", "bytes", LOWER, required=False, schema=NULLABLE),
        Metric("tokens_per_s", "tokens/s", HIGHER, required=False),
        Metric(SCALING, "ratio", HIGHER, required=False),
        # hpcmem's per-step accounting, named as in `hpcmem train` records
        *(Metric(name, "ms" if name.endswith("_ms") else UNITS.get(name, "bytes"),
                 None if name in UNITS else LOWER, required=False)
          for name in ACCOUNTING),
        Metric("gpu_step_share", "fraction", None, required=False,
               schema={**NONNEGATIVE, "maximum": 1}),
        Metric("peak_gpu_resident_bytes", "bytes", LOWER, required=False),
        Metric("escaped_bytes", "bytes", LOWER, required=False),
        # the least budget hpcmem's probe accepts (hpcmem.peers.floor draws it)
        Metric(FLOOR, "bytes", LOWER, required=False),
    ),
    fields={
        "required": ["variant", "model", "batch", "accumulate", "seq_len", "dtype",
                     "checkpointing"],
        "properties": {
            "variant": {"enum": list(VARIANTS)},
            "model": {"type": "string", "minLength": 1},
            "batch": {"type": "integer", "minimum": 1},
            "accumulate": {"type": "integer", "minimum": 1},
            "seq_len": {"type": "integer", "minimum": 1},
            "world_size": {"type": "integer", "minimum": 1},
            "ranks": {"type": ["array", "null"], "items": {"type": "object"}},
            "dtype": {"type": "string"},
            "checkpointing": {"type": "boolean"},
            "gpu_budget": NULLABLE,
            "offload": {"type": ["object", "null"]},
            "losses": {"type": ["array", "null"], "items": {"type": "number"}},
        },
    },
    metadata={"gpus": "gpu", "torch": "torch"},
    adopt=adopt,
)
