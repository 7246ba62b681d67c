"""The peers' records: what ``benchmarks/gpu/hf_offload.py`` writes, checked field by field
and read as the record contract's.

hf_offload.py runs one variant per process and appends one JSON object per run, without
the contract's common fields. ``hpcmem aggregate`` hands every line that has no
``benchmark`` but a ``variant`` to :func:`adopt` (through :mod:`hpcmem.results.registry`):
each field it reads is checked first, a ValueError naming the field, its value and what is
accepted (aggregate lists the line in ``rejected.csv`` with its file and line number), and
the record comes back with the contract's fields: ``benchmark`` ``peers``, ``timestamp`` the
run's ``date``, ``git_sha`` its ``git``, ``run_id`` ``hf_offload-<commit>``, the host,
version and binding unknown. The defaults hf_offload.py leaves out are written in (``dtype``
bf16, one micro-batch, each variant's own checkpointing, one GPU: ``world_size`` 1; a
data-parallel run's record, merged by its rank 0, has ``world_size``, ``ranks`` and
``host_peak_bytes``), hpcmem's per-step accounting
(``memory.offload``) is lifted to the top level under the names ``hpcmem train`` records use,
with its probe's floor (``probe_bytes``: the least budget it accepts) as :data:`FLOOR`, and
the loss curve gives ``final_loss`` (its last step's) and ``loss_steps`` (its length).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from hpcmem.errors import clip
from hpcmem.peers.variants import CHECKPOINTED, VARIANTS
from hpcmem.record.provenance import STATUSES

__all__ = ["ACCOUNTING", "BYTE_FIELDS", "FLOOR", "NAME", "PEAKS", "adopt", "check"]

#: the benchmark's name in the record contract
NAME = "peers"
#: the GPU memory a run held at most: PyTorch's allocated and reserved peaks, NVML's
#: per-process peak, and that with hpcmem's managed bytes on the GPU
PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes", "nvml_peak_bytes", "held_peak_bytes")
#: a record's optional byte counts: a number at least 0, or null (``host_peak_bytes``: the
#: process's largest resident host memory, pinned buffers included, the largest of a
#: data-parallel run's ranks; ``budget_minimum_bytes``: a refused budget's measured minimum)
BYTE_FIELDS = ("gpu_budget", *PEAKS, "host_peak_bytes", "budget_minimum_bytes")
#: the least GPU budget an ok hpcmem run's probe would have accepted (``memory.offload``'s
#: ``probe_bytes``)
FLOOR = "budget_floor_bytes"
#: hpcmem's per-step accounting (``memory.offload``) the record carries at its top level
ACCOUNTING = ("bytes_h2d", "bytes_d2h", "pcie_transfer_ms", "compute_ms", "backward_ms",
              "h2d_busy_ms", "d2h_busy_ms", "cpu_optimizer_ms", "step_bound_ms",
              "host_threads")
#: what a field of the contract takes where hf_offload.py cannot know it
UNKNOWN = "unknown"
#: the characters of a refused value a message shows
SHOWN = 60


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _share(value: Any) -> bool:
    """a share from 0 to 1"""
    return _is_number(value) and 0 <= value <= 1


def _threads(value: Any) -> bool:
    """a whole number of threads, at least 1"""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _name(value: Any) -> bool:
    """a name"""
    return isinstance(value, str)


#: the Offload settings a point's key reads, and what each accepts (its docstring says)
OFFLOAD_FIELDS: Mapping[str, Callable[[Any], bool]] = {
    "gpu_share": _share, "threads": _threads, "host_kernel": _name, "state_dtype": _name}


def _refuse(field: str, value: Any, accepted: str) -> ValueError:
    return ValueError(f"{field}={clip(repr(value), SHOWN)}: {accepted} is accepted")


def check(record: Mapping[str, Any]) -> None:
    """Nothing when ``record`` is an hf_offload.py record, else a ValueError naming the first
    field that is not, its value and what is accepted."""
    if record.get("variant") not in VARIANTS:
        raise _refuse("variant", record.get("variant"), f"one of {', '.join(VARIANTS)}")
    if not isinstance(record.get("model"), str) or not record["model"]:
        raise _refuse("model", record.get("model"), "a model's name")
    for field in ("batch", "seq_len", "accumulate", "world_size"):
        value = record.get(field, None if field in ("batch", "seq_len") else 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _refuse(field, value, "a whole number, at least 1,")
    for field in BYTE_FIELDS:
        value = record.get(field)
        if value is not None and not (_is_number(value) and value >= 0):
            raise _refuse(field, value, "a number of bytes, or null,")
    ranks = record.get("ranks")
    if ranks is not None and not (isinstance(ranks, list)
                                  and all(isinstance(rank, dict) for rank in ranks)):
        raise _refuse("ranks", ranks, "a list of each rank's figures (objects), or null,")
    if not isinstance(record.get("dtype", "bf16"), str):
        raise _refuse("dtype", record["dtype"], "a dtype's name")
    if record.get("checkpointing") is not None and not isinstance(record["checkpointing"], bool):
        raise _refuse("checkpointing", record["checkpointing"], "true, false or null")
    offload = record.get("offload")
    if offload is not None and not isinstance(offload, dict):
        raise _refuse("offload", offload, "hpcmem's Offload settings (an object), or null,")
    for field, accepted in OFFLOAD_FIELDS.items():
        value = (offload or {}).get(field)
        if value is not None and not accepted(value):
            raise _refuse(f"offload.{field}", value, f"{accepted.__doc__}, or null,")
    losses = record.get("losses")
    if losses is not None and not (isinstance(losses, list) and all(map(_is_number, losses))):
        raise _refuse("losses", losses, "a list of numbers, or null,")
    if not isinstance(record.get("date"), str) or not record["date"]:
        raise _refuse("date", record.get("date"), "the run's UTC time (ISO 8601)")
    if record.get("status") not in STATUSES:
        raise _refuse("status", record.get("status"), f"one of {', '.join(STATUSES)}")
    timing = record.get("step_ms")
    step = timing.get("median") if isinstance(timing, dict) else None
    if record["status"] == "ok" and not (_is_number(step) and step > 0):
        raise _refuse("step_ms", timing, "an ok record's step_ms with a median above 0 ms")
    mean = timing.get("mean") if isinstance(timing, dict) else None
    if mean is not None and not (_is_number(mean) and mean > 0):
        raise _refuse("step_ms.mean", mean, "a mean step above 0 ms, or none,")
    if record["status"] == "ok" and record["variant"] == "hpcmem" and not isinstance(
            record.get("memory"), dict):
        raise _refuse("memory", record.get("memory"),
                      "an object of memory statistics, in an ok hpcmem record,")


def _accounting(record: Mapping[str, Any]) -> dict[str, Any]:
    """hpcmem's per-step accounting and its probe's floor (:data:`FLOOR`), each figure where
    the record has a number for it."""
    memory = record.get("memory") if isinstance(record.get("memory"), dict) else {}
    offload = memory.get("offload") if isinstance(memory.get("offload"), dict) else {}
    split = offload.get("split") if isinstance(offload.get("split"), dict) else {}
    found = {**{name: offload.get(name) for name in ACCOUNTING},
             "gpu_step_share": split.get("share"),
             "peak_gpu_resident_bytes": memory.get("peak_gpu_resident_bytes"),
             "escaped_bytes": memory.get("escaped_bytes"), FLOOR: offload.get("probe_bytes")}
    return {name: value for name, value in found.items() if _is_number(value)}


def _loss(record: Mapping[str, Any]) -> dict[str, Any]:
    """The loss at the run's last step and how many steps it ran, where it logged losses."""
    losses = record.get("losses")
    return {"final_loss": losses[-1], "loss_steps": len(losses)} if losses else {}


def adopt(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """An hf_offload.py record as the record contract's, or None for a record that is not
    one (it has no ``variant``); a ValueError names a field :func:`check` refuses."""
    if "variant" not in record:
        return None
    check(record)
    git = record.get("git")
    ok = record["status"] == "ok"
    return {
        **record,
        "schema_version": 1,
        "benchmark": NAME,
        "run_id": f"hf_offload-{git[:7] if isinstance(git, str) and git else UNKNOWN}",
        "timestamp": record["date"],
        "host": record.get("host") or UNKNOWN,
        "slurm_job_id": None,
        "system": None,
        "git_sha": git if isinstance(git, str) else None,
        "hpcmem_version": UNKNOWN,
        "container": None,
        "binding": {},
        "reason": None if ok else str(record.get("reason") or "no reason recorded"),
        "dtype": record.get("dtype", "bf16"),
        "accumulate": record.get("accumulate", 1),
        "world_size": record.get("world_size", 1),
        "checkpointing": (record["variant"] in CHECKPOINTED if record.get("checkpointing") is None
                          else record["checkpointing"]),
        **_accounting(record),
        **_loss(record),
    }
