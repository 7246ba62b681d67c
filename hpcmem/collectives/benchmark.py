"""The collectives benchmark: every (op, buffer kind, size) point, checked, timed and recorded.

``run(comm, options, emit)`` is the one entry point (``fn(comm, args) -> records``):
for each op and buffer kind it allocates the largest buffers once (as OSU
does), writes them (inputs with rank-dependent values, receive buffers with a
sentinel), and for each size checks one call against the NumPy reference
before timing anything, and the result buffer again after the timed iterations (outside the
timed region), so a collective that goes wrong only while timed fails the point too. Each
point is timed in ``Options.repeats`` independent loops, in rounds over the sizes of an op
and buffer kind; its record keeps every repeat's figures (``repeats``) and their medians,
and the node state around them (``node``). Unless ``Options.native_loop`` is off, each point
is then timed once more by the native C loop on the same buffers (``native_latency_us``, and
``python_overhead_us`` = the difference of the averages); where the native loop is not
built, records say why in ``native_unavailable``.
Before the first point the ranks sleep for a moment while rank 0 measures how busy their
CPUs are: when the ranks outnumber the free ones, it says so before anything is timed.
Rank 0 emits OSU-style text through ``emit`` and returns the records; the other ranks
return an empty list. With ``Options.skip_reason`` set on any rank (the binding could not
be applied there) nothing runs: every point becomes a ``skipped`` record with that reason.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcmem.collectives import buffers, native, osu, slowdown, timing
from hpcmem.collectives.ops import OPS, SENTINEL, Op, check, rank_input
from hpcmem.collectives.options import Options
from hpcmem.collectives.sizes import osu_counts
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.collectives.spread import layout_fields, placement_by_host
from hpcmem.node import applied
from hpcmem.node.probe import mpi_library
from hpcmem.node.state import (
    SHARED_SLACK,
    YIELD_ENV,
    BusyCpus,
    load_average,
    node_state,
    yield_when_idle,
)
from hpcmem.record.provenance import common_fields

__all__ = ["describe", "exit_code", "merge_placements", "run"]

ROOT = 0
#: how long every rank sleeps while rank 0 measures the other work on their CPUs
IDLE_PROBE_SECONDS = 0.2
#: rounds over the sizes run and thrown away before the repeats: beside a CPU-heavy job the
#: first round after the ranks slept is often slowed for milliseconds, the later ones not
WARMUP_ROUNDS = 1


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
    cpus: tuple[int, ...] = ()  # the CPUs any rank may run on
    crowded: bool = False  # the ranks outnumbered the free CPUs before the run
    busy: BusyCpus | None = None  # rank 0: other work on the ranks' CPUs
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
    ctx: _Context, op: Op, kind: str, size: int, status: str, reason: str | None,
    node: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    node = {**(node or node_state(ctx.cpus, ctx.ranks)), "ranks_outnumber_free_cpus": ctx.crowded}
    record = common_fields(
        COLLECTIVES, binding=ctx.binding, status=status, reason=reason, run_id=ctx.run_id,
        node=node,
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
    if ctx.options.slowdown and ctx.options.slowdown[0] == op.name:
        record["injected_slowdown_us"] = ctx.options.slowdown[1]
    if ctx.native_unavailable:
        record["native_unavailable"] = ctx.native_unavailable
    record.update(fields)
    return record


def _bandwidths(op: Op, size: int, ranks: int, latency: timing.Latency) -> dict[str, float]:
    """Algorithm and bus bandwidth (GB/s, nccl-tests convention) at ``latency``."""
    seconds = latency.avg * 1e-6
    algbw = op.data_bytes(size, ranks) / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * op.bus_factor(ranks)}


def _repeat_fields(op: Op, size: int, ranks: int, repeats: list[timing.Latency]
                   ) -> dict[str, Any]:
    """The record's figures: every repeat's, and their medians at the top."""
    each = [{"latency_us": r.to_record(), **_bandwidths(op, size, ranks, r)} for r in repeats]
    return {
        "latency_us": timing.median_latency(repeats).to_record(),
        **{name: statistics.median(r[name] for r in each)
           for name in ("algbw_GBps", "busbw_GBps")},
        "repeats": each,
    }


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


@dataclass
class _Point:
    """One size of an op and buffer kind on this rank: its calls, result and repeats so far."""

    size: int
    count: int  # elements per message
    call: Callable[[], Any]  # the collective, prebound
    timed: Callable[[], Any]  # what the timed loop calls (the same, unless a test slows it)
    send: np.ndarray | None
    recv: np.ndarray | None
    result: np.ndarray | None
    reference: Any
    iterations: int
    warmup: int
    reason: str | None = None  # why its result is wrong, on this rank
    load_before: list[float] | None = None
    repeats: list[timing.Latency] = field(default_factory=list)


def _prepare(ctx: _Context, op: Op, size: int, send_full: np.ndarray | None,
             recv_full: np.ndarray | None) -> _Point:
    """Bind one size and check one call against the NumPy reference, before any timing."""
    from mpi4py import MPI

    comm, rank, ranks = ctx.comm, ctx.rank, ctx.ranks
    count = size // np.dtype(ctx.options.dtype).itemsize
    send_len, recv_len = op.layout(count, ranks, rank, ROOT)
    send = None if send_full is None or send_len is None else send_full[:send_len]
    recv = None if recv_full is None or recv_len is None else recv_full[:recv_len]
    if recv is not None:
        recv.fill(SENTINEL)
    call = op.prepare(comm, send, recv, count, ranks, ROOT, MPI)
    timed = call
    if ctx.options.slowdown and ctx.options.slowdown[0] == op.name:
        timed = slowdown.slowed(call, ctx.options.slowdown[1])
    iterations, warmup = osu_counts(size, ctx.options.iterations, ctx.options.warmup)
    point = _Point(size, count, call, timed, send, recv, recv if recv is not None else send,
                   op.reference(count, ranks, rank, ROOT), iterations, warmup)
    call()
    point.reason = check(op.name, point.result, point.reference)
    return point


def _time_once(ctx: _Context, op: Op, point: _Point) -> None:
    """One repeat of ``point``: the full timed loop, then its result checked again (outside
    the timed region), so a collective that goes wrong only while timed fails the point."""
    if not point.repeats:
        point.load_before = load_average()
    seconds = timing.rank_latency(ctx.comm, point.timed, point.iterations, point.warmup,
                                  separate=op.sized)
    point.repeats.append(timing.across_ranks(ctx.comm, seconds))
    if point.reason is None and (after := check(op.name, point.result, point.reference)):
        point.reason = f"after the timed iterations: {after}"


def _native_latency(ctx: _Context, op: Op, point: _Point) -> timing.Latency | None:
    """The same buffers timed once more by the native C loop, and checked again (None when
    the native loop is off or not built)."""
    if not ctx.native:
        return None
    seconds = native.rank_latency(ctx.comm, op, point.send, point.recv, point.count, ROOT,
                                  point.iterations, point.warmup)
    if point.reason is None and (after := check(op.name, point.result, point.reference)):
        point.reason = f"after the native loop's timed iterations: {after}"
    return timing.across_ranks(ctx.comm, seconds)


def _finish(ctx: _Context, op: Op, kind: str, point: _Point) -> None:
    """Time the native loop, record one size (rank 0) and print its OSU row."""
    node = _node_mark(ctx, point.load_before)
    native_latency = _native_latency(ctx, op, point)
    reasons = ctx.comm.gather(point.reason, root=0)
    placements = ctx.comm.gather([_placement(point.send), _placement(point.recv)], root=0)
    if ctx.rank != 0:
        return
    failures = [f"rank {r}: {text}" for r, text in enumerate(reasons) if text]
    status, why = ("failed", "; ".join(failures)) if failures else ("ok", None)
    latency = timing.median_latency(point.repeats)
    placement = merge_placements([p for pair in placements for p in pair])
    placement["hosts"] = placement_by_host(placements, ctx.hosts, merge_placements)
    native_fields = {} if native_latency is None else {
        "native_latency_us": native_latency.to_record(),
        "python_overhead_us": latency.avg - native_latency.avg,
    }
    ctx.records.append(
        _record(
            ctx,
            op,
            kind,
            point.size,
            status,
            why,
            node=node,
            placement=placement,
            **_repeat_fields(op, point.size, ctx.ranks, point.repeats),
            validated=not failures,
            **native_fields,
        )
    )
    ctx.emit(osu.row(op, point.size, latency, point.iterations))
    if failures:
        ctx.emit(osu.note_line("failed", why, point.size if op.sized else None))


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
        points = [_prepare(ctx, op, size, send, recv) for size in _op_sizes(ctx, op)]
        # repeats in rounds over the sizes: a burst of other work on the node then hits one
        # repeat of several points (spread), not every repeat of one point (a false change)
        for _ in range(WARMUP_ROUNDS):  # untimed: settles the ranks' scheduling first
            for point in points:
                _time_once(ctx, op, point)
                point.repeats.clear()
        for _ in range(ctx.options.repeats):
            for point in points:
                _time_once(ctx, op, point)
        for point in points:
            _finish(ctx, op, kind, point)
        if ctx.rank == 0:
            for line in osu.native_lines(op, ctx.records[-len(points):], ctx.native_unavailable):
                ctx.emit(line)
        del send, recv, points  # before ExitStack frees MPI.Alloc_mem memory


def _run_id(options: Options) -> str:
    return options.run_id or os.environ.get("HPCMEM_RUN_ID") or uuid.uuid4().hex[:12]


def _node_mark(ctx: _Context, load_before: list[float] | None = None) -> dict[str, Any] | None:
    """A mark of the other work on the ranks' CPUs (every rank's CPU time gathered); on rank
    0 the ``node`` field of a point measured since ``load_before`` was read."""
    own = ctx.comm.gather(time.process_time(), root=0)
    if ctx.busy is None:
        return None
    other = ctx.busy.mark(sum(own))
    return node_state(ctx.cpus, ctx.ranks, load_before=load_before, other_busy_cpus=other)


def _crowded(ctx: _Context) -> bool:
    """Whether the ranks outnumber their CPUs not busy with other work, measured while every
    rank sleeps for a moment; rank 0 says so on stderr before anything is timed."""
    ctx.busy = BusyCpus(ctx.cpus, ctx.ranks) if ctx.rank == 0 else None
    ctx.comm.Barrier()
    _node_mark(ctx)
    time.sleep(IDLE_PROBE_SECONDS)
    node = _node_mark(ctx)
    if node is None:
        return False
    other = node["other_busy_cpus"]
    if other is None or ctx.ranks <= len(ctx.cpus) - other + SHARED_SLACK:
        return False
    waiting = ("they yield the CPU while waiting" if yield_when_idle()
               else f"busy-polling ranks wait for a time slice: set {YIELD_ENV}=1 "
               "(collectives.yield_when_idle) on shared nodes")
    note = (f"{ctx.ranks} ranks on {len(ctx.cpus)} CPUs, {other:.1f} of them busy with other "
            f"work: ranks share cores, latencies include waiting ({waiting})")
    print(f"hpcmem collectives: warning: {note}", file=sys.stderr, flush=True)
    return True


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
        cpus = tuple(sorted({cpu for rank in per_rank or () for cpu in rank["cpus"]}))
        missing = comm.allgather(native.unavailable() if options.native_loop else None)
        why = "; ".join(sorted({text for text in missing if text})) or None
        ctx = _Context(
            comm, options, emit, run_id, binding, mpi_library(), buffers.memory_settings(),
            thread_level=_thread_level(), native=options.native_loop and not why,
            native_unavailable=why, cpus=cpus, hosts=[rank["host"] for rank in per_rank or []],
        )
        reasons = comm.allgather(options.skip_reason)  # one rank unable: none runs
        skip = "; ".join(sorted({reason for reason in reasons if reason}))
        if not skip:
            ctx.crowded = _crowded(ctx)
        for name in options.ops:
            for kind in options.buffers:
                if skip:
                    _skip_all(ctx, OPS[name], kind, skip)
                else:
                    _run_op_buffer(ctx, OPS[name], kind)
        return ctx.records
    finally:
        buffers.set_numpy_hugepage(previous)
