"""The collectives benchmark: every (op, buffer kind, size) point, checked, timed and recorded.

``run(comm, options, emit)`` is the one entry point (``fn(comm, args) -> records``):
for each op and buffer kind it allocates the largest buffers once (as OSU
does), writes them (inputs with rank-dependent values, receive buffers with a
sentinel), and for each size checks one call against the NumPy reference
before timing anything, and the result buffer again after the timed iterations (outside the
timed region), so a collective that goes wrong only while timed fails the point too.
Each point is timed by the mpi4py loop (``latency_us``) and, unless ``Options.native_loop``
is off, by the native C loop on the same buffers (``native_latency_us``, and
``python_overhead_us`` = the difference of the averages); where the native loop is not
built, records say why in ``native_unavailable``.
Rank 0 emits OSU-style text through ``emit`` and returns the records; the other ranks
return an empty list. With ``Options.skip_reason`` set on any rank (the binding could not
be applied there) nothing runs: every point becomes a ``skipped`` record with that reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcmem.collectives import buffers, native, osu, timing
from hpcmem.collectives.ops import OPS, SENTINEL, Op, check, rank_input
from hpcmem.collectives.options import Options
from hpcmem.collectives.sizes import osu_counts
from hpcmem.collectives.spread import layout_fields, placement_by_host
from hpcmem.node import applied
from hpcmem.node.probe import mpi_library
from hpcmem.results.records import common_fields

__all__ = ["describe", "exit_code", "merge_placements", "run"]

ROOT = 0


@dataclass
class _Context:
    """What every point of one run shares."""

    comm: Any
    options: Options
    emit: Callable[[str], None]
    run_id: str
    binding: dict[str, Any]
    mpi_library: str
    memory: dict[str, Any]
    thread_level: str
    native: bool  # time every point with the native loop too
    native_unavailable: str | None  # asked for, but not built here: why
    #: each rank's host name (rank i ran on hosts[i])
    hosts: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def ranks(self) -> int:
        return self.comm.Get_size()


def exit_code(records: list[dict[str, Any]]) -> int:
    """1 when any point failed (a wrong result), else 0; skipped points are not failures."""
    return 1 if any(record["status"] == "failed" for record in records) else 0


def _placement(array: np.ndarray | None) -> dict[str, Any] | None:
    if array is None or array.size == 0:
        return None
    from hpcmem import hbw

    try:
        return hbw.placement(array).to_record()
    except hbw.MemkindNotBuiltError:
        return None


def merge_placements(placements: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One placement for all buffers of all ranks.

    Pages per node and per memory policy (``bind:0``, ``default``…) are summed, the HBW
    fraction is weighted by touched pages;
    ``emulated`` holds when any rank's HBW nodes were declared, not detected.
    """
    measured = [p for p in placements if p is not None]
    nodes: dict[str, int] = {}
    policies: dict[str, int] = {}
    hbw_pages = 0.0
    for placement in measured:
        for node, count in placement["nodes"].items():
            nodes[node] = nodes.get(node, 0) + count
        for policy, count in placement.get("policies", {}).items():
            policies[policy] = policies.get(policy, 0) + count
        if placement["hbw_fraction"] is not None:
            hbw_pages += placement["hbw_fraction"] * sum(placement["nodes"].values())
    touched = sum(nodes.values())
    known = any(p["hbw_fraction"] is not None for p in measured)
    return {
        "hbw_fraction": hbw_pages / touched if known and touched else None,
        "nodes": dict(sorted(nodes.items(), key=lambda item: int(item[0]))),
        "emulated": any(p["emulated"] for p in measured),
        "hbw_nodes": sorted({node for p in measured for node in p.get("hbw_nodes", [])}),
        "pages": sum(p.get("pages", 0) for p in measured),
        "untouched": sum(p.get("untouched", 0) for p in measured),
        "policies": dict(sorted(policies.items())),
        "memkind_kinds": sorted({p["kind"] for p in measured if p.get("kind")}),
        "buffers": len(measured),
    }


def describe(kind: str, placement: dict[str, Any], memory: dict[str, Any]) -> str:
    """The ``# hpcmem buffer:`` note: kind, memory tier and NUMA nodes actually used."""
    if not placement["buffers"]:
        return f"{kind} (no buffers: the op moves no data)"
    fraction = placement["hbw_fraction"]
    if fraction and fraction >= 1.0:
        tier = "emulated HBW" if placement["emulated"] else "HBW"
    elif fraction:
        tier = f"{fraction:.0%} HBW"
    else:
        tier = "DRAM"
    nodes = list(placement["nodes"])
    where = f"node{'s' if len(nodes) != 1 else ''} {','.join(nodes) or '-'}"
    extra = ""
    if kind == "numpy":
        extra = f", NumPy huge-page advice {'on' if memory['numpy_madvise_hugepage'] else 'off'}"
    return f"{kind} ({tier}, {where}{extra})"


def _record(
    ctx: _Context, op: Op, kind: str, size: int, status: str, reason: str | None, **fields: Any
) -> dict[str, Any]:
    record = common_fields(
        "collectives", binding=ctx.binding, status=status, reason=reason, run_id=ctx.run_id
    )
    iterations, warmup = osu_counts(size, ctx.options.iterations, ctx.options.warmup)
    record.update(
        op=op.name,
        buffer=kind,
        dtype=ctx.options.dtype,
        root=ROOT,
        ranks=ctx.ranks,
        **layout_fields(ctx.hosts),
        size_bytes=size if op.sized else 0,
        iterations=iterations,
        warmup=warmup,
        mpi_library=ctx.mpi_library,
        mpi_thread_level=ctx.thread_level,
        memory=ctx.memory,
    )
    if ctx.native_unavailable:
        record["native_unavailable"] = ctx.native_unavailable
    record.update(fields)
    return record


def _op_sizes(ctx: _Context, op: Op) -> tuple[int, ...]:
    return ctx.options.sizes if op.sized else (0,)


def _skip_all(ctx: _Context, op: Op, kind: str, reason: str) -> None:
    if ctx.rank != 0:
        return
    for line in osu.header_lines(op, f"{kind} (unavailable)"):
        ctx.emit(line)
    ctx.emit(osu.note_line("skipped", reason))
    for size in _op_sizes(ctx, op):
        ctx.records.append(_record(ctx, op, kind, size, "skipped", reason))


def _allocate(
    ctx: _Context, op: Op, kind: str, stack: ExitStack
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The largest send and receive buffers of this op on this rank, written."""
    dtype = np.dtype(ctx.options.dtype)
    count = max(_op_sizes(ctx, op)) // dtype.itemsize
    send_len, recv_len = op.layout(count, ctx.ranks, ctx.rank, ROOT)
    send = None if send_len is None else buffers.allocate(kind, send_len, dtype, stack)
    recv = None if recv_len is None else buffers.allocate(kind, recv_len, dtype, stack)
    if send is not None:
        send[:] = rank_input(ctx.rank, send.size, dtype)
    if recv is not None:
        recv.fill(SENTINEL)
    return send, recv


def _point(
    ctx: _Context,
    op: Op,
    kind: str,
    size: int,
    send_full: np.ndarray | None,
    recv_full: np.ndarray | None,
) -> None:
    """Check, time and record one size."""
    from mpi4py import MPI

    comm, rank, ranks = ctx.comm, ctx.rank, ctx.ranks
    count = size // np.dtype(ctx.options.dtype).itemsize
    send_len, recv_len = op.layout(count, ranks, rank, ROOT)
    send = None if send_full is None or send_len is None else send_full[:send_len]
    recv = None if recv_full is None or recv_len is None else recv_full[:recv_len]
    if recv is not None:
        recv.fill(SENTINEL)
    call = op.prepare(comm, send, recv, count, ranks, ROOT, MPI)
    result = recv if recv is not None else send
    reference = op.reference(count, ranks, rank, ROOT)
    call()
    reason = check(op.name, result, reference)
    iterations, warmup = osu_counts(size, ctx.options.iterations, ctx.options.warmup)
    latency = timing.across_ranks(
        comm, timing.rank_latency(comm, call, iterations, warmup, separate=op.sized)
    )
    if reason is None and (after := check(op.name, result, reference)):  # outside the timing
        reason = f"after the timed iterations: {after}"
    native_latency = None
    if ctx.native:  # then the same buffers again, timed in C, and checked again
        native_latency = timing.across_ranks(
            comm, native.rank_latency(comm, op, send, recv, count, ROOT, iterations, warmup)
        )
        if reason is None and (after := check(op.name, result, reference)):
            reason = f"after the native loop's timed iterations: {after}"
    reasons = comm.gather(reason, root=0)
    placements = comm.gather([_placement(send), _placement(recv)], root=0)
    if rank != 0:
        return
    failures = [f"rank {r}: {text}" for r, text in enumerate(reasons) if text]
    status, why = ("failed", "; ".join(failures)) if failures else ("ok", None)
    placement = merge_placements([p for pair in placements for p in pair])
    placement["hosts"] = placement_by_host(placements, ctx.hosts, merge_placements)
    seconds = latency.avg * 1e-6
    algbw = op.data_bytes(size, ranks) / seconds / 1e9 if seconds > 0 else 0.0
    native_fields = {} if native_latency is None else {
        "native_latency_us": native_latency.to_record(),
        "python_overhead_us": latency.avg - native_latency.avg,
    }
    ctx.records.append(
        _record(
            ctx,
            op,
            kind,
            size,
            status,
            why,
            placement=placement,
            latency_us=latency.to_record(),
            algbw_GBps=algbw,
            busbw_GBps=algbw * op.bus_factor(ranks),
            validated=not failures,
            **native_fields,
        )
    )
    ctx.emit(osu.row(op, size, latency, iterations))
    if failures:
        ctx.emit(osu.note_line("failed", why, size if op.sized else None))


def _run_op_buffer(ctx: _Context, op: Op, kind: str) -> None:
    with ExitStack() as stack:
        try:
            send, recv = _allocate(ctx, op, kind, stack)
            local = None
        except buffers.BufferUnavailableError as error:
            send = recv = None
            local = str(error)
        except MemoryError as error:  # more than this node can give: the points cannot run here
            send = recv = None
            local = f"{kind}: allocation failed ({error})"
        reasons = ctx.comm.allgather(local)
        if any(reasons):
            why = "; ".join(sorted({text for text in reasons if text}))
            _skip_all(ctx, op, kind, why)
            return
        placements = ctx.comm.gather([_placement(send), _placement(recv)], root=0)
        if ctx.rank == 0:
            merged = merge_placements([p for pair in placements for p in pair])
            for line in osu.header_lines(op, describe(kind, merged, ctx.memory)):
                ctx.emit(line)
        for size in _op_sizes(ctx, op):
            _point(ctx, op, kind, size, send, recv)
        if ctx.rank == 0:
            for line in osu.native_lines(op, ctx.records[-len(_op_sizes(ctx, op)) :],
                                         ctx.native_unavailable):
                ctx.emit(line)
        del send, recv  # before ExitStack frees MPI.Alloc_mem memory


def _run_id(options: Options) -> str:
    return options.run_id or os.environ.get("HPCMEM_RUN_ID") or uuid.uuid4().hex[:12]


def _thread_level() -> str:
    """The thread level MPI provides (``single`` ... ``multiple``), as mpi4py spells them."""
    from mpi4py import MPI

    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return levels[MPI.Query_thread()]


def run(comm: Any, options: Options, emit: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run every point of ``options`` on ``comm``; rank 0 gets the records, other ranks ``[]``."""
    previous = buffers.set_numpy_hugepage(options.numpy_hugepage)
    try:
        per_rank = comm.gather(applied.current(), root=0)
        run_id = comm.bcast(_run_id(options) if comm.Get_rank() == 0 else None, root=0)
        binding = {**per_rank[0], "per_rank": per_rank} if per_rank else {}
        missing = comm.allgather(native.unavailable() if options.native_loop else None)
        why = "; ".join(sorted({text for text in missing if text})) or None
        ctx = _Context(
            comm, options, emit, run_id, binding, mpi_library(), buffers.memory_settings(),
            thread_level=_thread_level(), native=options.native_loop and not why,
            native_unavailable=why, hosts=[rank["host"] for rank in per_rank or []],
        )
        reasons = comm.allgather(options.skip_reason)  # one rank unable: none runs
        skip = "; ".join(sorted({reason for reason in reasons if reason}))
        for name in options.ops:
            for kind in options.buffers:
                if skip:
                    _skip_all(ctx, OPS[name], kind, skip)
                else:
                    _run_op_buffer(ctx, OPS[name], kind)
        return ctx.records
    finally:
        buffers.set_numpy_hugepage(previous)
