"""The record of one collectives point: what the run shares, the point, its figures.

A record is :func:`hpcmem.record.provenance.common_fields` plus the point (op, buffer
kind, dtype, ranks and where they ran, size, iterations), the MPI library and thread level,
the memory settings, the HBW backend (and the VM topology in a tools/vm guest) and, for a
measured point, its figures: every repeat's latency and
bandwidths with their medians at the top (:func:`figure_fields`). Field by field:
docs/records.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from hpcmem.collectives import timing
from hpcmem.collectives.ops import ROOT, Op
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.collectives.spread import layout_fields
from hpcmem.node.state import node_state
from hpcmem.record.provenance import common_fields

__all__ = ["RunFacts", "figure_fields", "point_record"]


@dataclass(frozen=True)
class RunFacts:
    """What every record of one run shares: how it was identified, set up and bound."""

    run_id: str
    binding: dict[str, Any]
    hosts: tuple[str, ...]  # rank i ran on hosts[i] (known on rank 0)
    cpus: tuple[int, ...]  # the CPUs any rank may run on
    ranks: int
    dtype: str
    mpi_library: str
    thread_level: str  # the MPI thread level provided
    memory: dict[str, Any]  # huge-page settings (hpcmem.collectives.buffers.memory_settings)
    native_unavailable: str | None  # the native loop was asked for, but not built here: why
    crowded: bool  # the ranks outnumbered the free CPUs before the run
    hbw_backend: dict[str, Any]  # what served the kinds: name and version (or why none)
    vm_topology: dict[str, Any] | None  # the tools/vm topology this ran in, if any


def point_record(
    run: RunFacts, op: Op, kind: str, size: int, counts: tuple[int, int], status: str,
    reason: str | None, *, slowdown_us: float | None = None,
    node: dict[str, Any] | None = None, **fields: Any,
) -> dict[str, Any]:
    """The record of ``op`` on ``kind`` buffers at ``size`` bytes, timed ``counts``
    (iterations, warmup) times, with ``fields`` (placement, figures) added.

    ``node`` is the node state measured around the point (default: now, other work not
    measured); ``slowdown_us``, the test hook's sleep per call, marks a slowed record.
    """
    node = {**(node or node_state(run.cpus, run.ranks)),
            "ranks_outnumber_free_cpus": run.crowded}
    record = common_fields(
        COLLECTIVES, binding=run.binding, status=status, reason=reason, run_id=run.run_id,
        node=node,
    )
    iterations, warmup = counts
    record.update(
        op=op.name,
        buffer=kind,
        dtype=run.dtype,
        root=ROOT,
        ranks=run.ranks,
        **layout_fields(run.hosts),
        size_bytes=size if op.sized else 0,
        iterations=iterations,
        warmup=warmup,
        mpi_library=run.mpi_library,
        mpi_thread_level=run.thread_level,
        memory=run.memory,
        hbw_backend=run.hbw_backend,
    )
    if run.vm_topology is not None:
        record["vm_topology"] = run.vm_topology
    if slowdown_us is not None:
        record["injected_slowdown_us"] = slowdown_us
    if run.native_unavailable:
        record["native_unavailable"] = run.native_unavailable
    record.update(fields)
    return record


def _bandwidths(op: Op, size: int, ranks: int, latency: timing.Latency) -> dict[str, float]:
    """Algorithm and bus bandwidth (GB/s, nccl-tests convention) at ``latency``."""
    seconds = latency.avg * 1e-6
    algbw = op.data_bytes(size, ranks) / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * op.bus_factor(ranks)}


def figure_fields(op: Op, size: int, ranks: int, repeats: list[timing.Latency],
                  native: timing.Latency | None) -> dict[str, Any]:
    """A measured point's figures: every repeat's, their medians at the top, and with the
    native loop's latency (``native``) Python's overhead over it."""
    each = [{"latency_us": r.to_record(), **_bandwidths(op, size, ranks, r)} for r in repeats]
    latency = timing.median_latency(repeats)
    fields = {
        "latency_us": latency.to_record(),
        **{name: statistics.median(r[name] for r in each)
           for name in ("algbw_GBps", "busbw_GBps")},
        "repeats": each,
    }
    if native is not None:
        fields.update(native_latency_us=native.to_record(),
                      python_overhead_us=latency.avg - native.avg)
    return fields
