"""The collectives benchmark: every (op, buffer kind, size) point, checked, timed and recorded.

``run(comm, options, emit)`` is the one entry point (``fn(comm, args) -> records``):
for each op and buffer kind of the :class:`~hpcmem.collectives.options.Sweep` it allocates
the largest buffers once (as OSU does), writes them (inputs with rank-dependent values,
receive buffers with a sentinel), and for each size checks one call against the NumPy
reference before timing anything, and the result buffer again after the timed iterations
(outside the timed region), so a collective that goes wrong only while timed fails the
point too. Each point is timed in ``Knobs.repeats`` independent loops, in rounds over the
sizes of an op and buffer kind; its record (:mod:`hpcmem.collectives.record`) keeps every
repeat's figures (``repeats``) and their medians, the placement of its buffers
(:mod:`hpcmem.collectives.placement`) and the node state around them (``node``,
:mod:`hpcmem.collectives.node_watch`). Unless ``Knobs.native_loop`` is off, each point is
then timed once more by the native C loop on the same buffers (``native_latency_us``, and
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
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcmem.collectives import buffers, native, osu, timing
from hpcmem.collectives.node_watch import NodeWatch
from hpcmem.collectives.ops import OPS, ROOT, SENTINEL, Op, check, rank_input
from hpcmem.collectives.options import Knobs, Options
from hpcmem.collectives.placement import describe, gather_placements, point_placement
from hpcmem.collectives.record import RunFacts, figure_fields, point_record
from hpcmem.collectives.slowdown import TestHooks
from hpcmem.node import applied
from hpcmem.node.probe import hbw_backend_info, mpi_library
from hpcmem.node.state import load_average
from hpcmem.node.virtual import vm_topology

__all__ = ["exit_code", "run"]

#: rounds over the sizes run and thrown away before the repeats: beside a CPU-heavy job the
#: first round after the ranks slept is often slowed for milliseconds, the later ones not
WARMUP_ROUNDS = 1

Emit = Callable[[str], None]
Record = dict[str, Any]


def exit_code(records: list[Record]) -> int:
    """1 when any point failed (a wrong result), else 0; skipped points are not failures."""
    return 1 if any(record["status"] == "failed" for record in records) else 0


def _joined(reasons: Iterable[str | None]) -> str | None:
    """The ranks' distinct reasons in one line; None when no rank gave one."""
    return "; ".join(sorted({text for text in reasons if text})) or None


def _skip_all(comm: Any, op: Op, kind: str, reason: str, *, sizes: tuple[int, ...],
              knobs: Knobs, hooks: TestHooks, facts: RunFacts, emit: Emit) -> list[Record]:
    """Every size of ``op`` on ``kind`` buffers recorded as skipped (rank 0)."""
    if comm.Get_rank() != 0:
        return []
    for line in osu.header_lines(op, f"{kind} (unavailable)"):
        emit(line)
    emit(osu.note_line("skipped", reason))
    return [point_record(facts, op, kind, size, knobs.counts(size), "skipped", reason,
                         slowdown_us=hooks.slowdown_us(op.name)) for size in sizes]


def _allocate(comm: Any, op: Op, kind: str, count: int, dtype: np.dtype, stack: ExitStack
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The send and receive buffers of ``count`` elements of this op on this rank, written."""
    rank = comm.Get_rank()
    send_len, recv_len = op.layout(count, comm.Get_size(), rank, ROOT)
    send = None if send_len is None else buffers.allocate(kind, send_len, dtype, stack)
    recv = None if recv_len is None else buffers.allocate(kind, recv_len, dtype, stack)
    if send is not None:
        send[:] = rank_input(rank, send.size, dtype)
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


def _prepare(comm: Any, op: Op, size: int, dtype: np.dtype, send_full: np.ndarray | None,
             recv_full: np.ndarray | None, *, knobs: Knobs, hooks: TestHooks) -> _Point:
    """Bind one size and check one call against the NumPy reference, before any timing."""
    from mpi4py import MPI

    rank, ranks = comm.Get_rank(), comm.Get_size()
    count = size // dtype.itemsize
    send_len, recv_len = op.layout(count, ranks, rank, ROOT)
    send = None if send_full is None or send_len is None else send_full[:send_len]
    recv = None if recv_full is None or recv_len is None else recv_full[:recv_len]
    if recv is not None:
        recv.fill(SENTINEL)
    call = op.prepare(comm, send, recv, count, ranks, ROOT, MPI)
    point = _Point(size, count, call, hooks.timed(op.name, call), send, recv,
                   recv if recv is not None else send, op.reference(count, ranks, rank, ROOT),
                   *knobs.counts(size))
    call()
    point.reason = check(op.name, point.result, point.reference)
    return point


def _time_once(comm: Any, op: Op, point: _Point) -> None:
    """One repeat of ``point``: the full timed loop, then its result checked again (outside
    the timed region), so a collective that goes wrong only while timed fails the point."""
    if not point.repeats:
        point.load_before = load_average()
    seconds = timing.rank_latency(comm, point.timed, point.iterations, point.warmup,
                                  separate=op.sized)
    point.repeats.append(timing.across_ranks(comm, seconds))
    if point.reason is None and (after := check(op.name, point.result, point.reference)):
        point.reason = f"after the timed iterations: {after}"


def _native_latency(comm: Any, op: Op, point: _Point) -> timing.Latency:
    """The same buffers timed once more by the native C loop, and checked again."""
    seconds = native.rank_latency(comm, op, point.send, point.recv, point.count, ROOT,
                                  point.iterations, point.warmup)
    if point.reason is None and (after := check(op.name, point.result, point.reference)):
        point.reason = f"after the native loop's timed iterations: {after}"
    return timing.across_ranks(comm, seconds)


def _finish(comm: Any, op: Op, kind: str, point: _Point, *, native: bool, hooks: TestHooks,
            facts: RunFacts, watch: NodeWatch, emit: Emit) -> Record | None:
    """Time the native loop (when ``native``), then on rank 0 record one size and print its
    OSU row; the record, or None on the other ranks."""
    node = watch.mark(comm, point.load_before)
    native_latency = _native_latency(comm, op, point) if native else None
    reasons = comm.gather(point.reason, root=0)
    placements = gather_placements(comm, point.send, point.recv)
    if comm.Get_rank() != 0:
        return None
    failures = [f"rank {r}: {text}" for r, text in enumerate(reasons) if text]
    status, why = ("failed", "; ".join(failures)) if failures else ("ok", None)
    record = point_record(
        facts, op, kind, point.size, (point.iterations, point.warmup), status, why,
        slowdown_us=hooks.slowdown_us(op.name), node=node,
        placement=point_placement(placements, facts.hosts),
        **figure_fields(op, point.size, facts.ranks, point.repeats, native_latency),
        validated=not failures,
    )
    emit(osu.row(op, point.size, timing.median_latency(point.repeats), point.iterations))
    if failures:
        emit(osu.note_line("failed", why, point.size if op.sized else None))
    return record


def _run_op_buffer(comm: Any, op: Op, kind: str, *, sizes: tuple[int, ...], knobs: Knobs,
                   hooks: TestHooks, facts: RunFacts, watch: NodeWatch, emit: Emit
                   ) -> list[Record]:
    """Every size of ``op`` on ``kind`` buffers, checked, timed and (rank 0) recorded."""
    dtype = np.dtype(facts.dtype)
    native = knobs.native_loop and not facts.native_unavailable
    with ExitStack() as stack:
        try:
            send, recv = _allocate(comm, op, kind, max(sizes) // dtype.itemsize, dtype, stack)
            local = None
        except buffers.BufferUnavailableError as error:
            send = recv = None
            local = str(error)
        except MemoryError as error:  # more than this node can give: the points cannot run here
            send = recv = None
            local = f"{kind}: allocation failed ({error})"
        if why := _joined(comm.allgather(local)):
            return _skip_all(comm, op, kind, why, sizes=sizes, knobs=knobs, hooks=hooks,
                             facts=facts, emit=emit)
        placements = gather_placements(comm, send, recv)
        if comm.Get_rank() == 0:
            note = describe(kind, point_placement(placements, facts.hosts), facts.memory)
            for line in osu.header_lines(op, note):
                emit(line)
        points = [_prepare(comm, op, size, dtype, send, recv, knobs=knobs, hooks=hooks)
                  for size in sizes]
        # repeats in rounds over the sizes: a burst of other work on the node then hits one
        # repeat of several points (spread), not every repeat of one point (a false change)
        for _ in range(WARMUP_ROUNDS):  # untimed: settles the ranks' scheduling first
            for point in points:
                _time_once(comm, op, point)
                point.repeats.clear()
        for _ in range(knobs.repeats):
            for point in points:
                _time_once(comm, op, point)
        finished = [_finish(comm, op, kind, point, native=native, hooks=hooks, facts=facts,
                            watch=watch, emit=emit) for point in points]
        del send, recv, points  # before ExitStack frees MPI.Alloc_mem memory
    records = [record for record in finished if record is not None]  # rank 0 only
    if comm.Get_rank() == 0:
        for line in osu.native_lines(op, records, facts.native_unavailable):
            emit(line)
    return records


def _run_id(asked: str | None) -> str:
    return asked or os.environ.get("HPCMEM_RUN_ID") or uuid.uuid4().hex[:12]


def _thread_level() -> str:
    """The thread level MPI provides (``single`` ... ``multiple``), as mpi4py spells them."""
    from mpi4py import MPI

    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return levels[MPI.Query_thread()]


def run(comm: Any, options: Options, emit: Emit) -> list[Record]:
    """Run every point of ``options`` on ``comm``; rank 0 gets the records, other ranks ``[]``."""
    sweep, knobs, hooks = options.sweep, options.knobs, options.hooks
    previous = buffers.set_numpy_hugepage(knobs.numpy_hugepage)
    try:
        per_rank = comm.gather(applied.current(), root=0) or []
        run_id = comm.bcast(_run_id(options.run_id) if comm.Get_rank() == 0 else None, root=0)
        cpus = tuple(sorted({cpu for rank in per_rank for cpu in rank["cpus"]}))
        missing = comm.allgather(native.unavailable() if knobs.native_loop else None)
        skip = _joined(comm.allgather(options.skip_reason))  # one rank unable: none runs
        watch = NodeWatch.start(comm, cpus)
        crowded = False if skip else watch.crowded(comm)
        facts = RunFacts(
            run_id=run_id,
            binding={**per_rank[0], "per_rank": per_rank} if per_rank else {},
            hosts=tuple(rank["host"] for rank in per_rank),
            cpus=cpus,
            ranks=comm.Get_size(),
            dtype=sweep.dtype,
            mpi_library=mpi_library(),
            thread_level=_thread_level(),
            memory=buffers.memory_settings(),
            native_unavailable=_joined(missing),
            crowded=crowded,
            hbw_backend=hbw_backend_info(),
            vm_topology=vm_topology(),
        )
        records: list[Record] = []
        for name in sweep.ops:
            op = OPS[name]
            for kind in sweep.buffers:
                if skip:
                    records += _skip_all(comm, op, kind, skip, sizes=sweep.sizes_of(op),
                                         knobs=knobs, hooks=hooks, facts=facts, emit=emit)
                else:
                    records += _run_op_buffer(comm, op, kind, sizes=sweep.sizes_of(op),
                                              knobs=knobs, hooks=hooks, facts=facts,
                                              watch=watch, emit=emit)
        return records
    finally:
        buffers.set_numpy_hugepage(previous)
