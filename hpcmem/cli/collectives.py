"""OSU-compatible latency benchmark of mpi4py collectives on NumPy, memkind and MPI buffers.

Run it under a launcher: `mpirun -n 2 hpcmem collectives --op allreduce --buffer numpy,hbw`.
Every point is checked against a NumPy reference before it is timed and again after the
timed iterations; a wrong result marks the record `failed` and the exit code 1. Timing follows
OSU's C suite: each iteration timed alone with MPI.Wtime, a barrier between
iterations outside the timed region, avg/min/max of the ranks' mean latencies. Each point
is timed twice on the same buffers: by the mpi4py loop (the figures OSU's columns show) and
by the native C loop (`--native-loop`, a `#` block after each table); the records carry both,
and Python's overhead as their difference. MPI starts at `--thread-level` (default single,
as OSU's MPI_Init).
Rank 0 prints OSU-style tables (`osu_<op> -f` columns) and writes JSONL records
(--output, written atomically). A buffer kind this node cannot provide (hbw
without an HBW node: set MEMKIND_HBW_NODES to emulate one) becomes `skipped`.
When HPCMEM_SKIP_REASON is set (by `hpcmem bind --skip-unavailable`, whose binding
this node cannot provide) nothing runs: every point is recorded `skipped` with that
reason and the exit code is 0.

Sizes (8, 4K, 1M; doubling from --min-size) are bytes per rank as in OSU: the
whole vector for bcast, reduce, allreduce and reduce_scatter (split among the
ranks), one rank's block for gather, allgather and scatter, the block for each
peer in alltoall.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcmem.cli import UsageError, bad_input
from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES, OPS
from hpcmem.collectives.options import DEFAULT_MAX_SIZE, DEFAULT_OPS, THREAD_LEVELS
from hpcmem.collectives.sizes import (
    LARGE_MESSAGE_SIZE,
    OSU_ITERATIONS,
    OSU_ITERATIONS_LARGE,
    OSU_WARMUP,
    OSU_WARMUP_LARGE,
)
from hpcmem.node.idlist import IdListError
from hpcmem.node.launcher import global_rank
from hpcmem.node.topology import hbw_nodes
from hpcmem.outputs import OutputPathError, check_output_file, write_errors

if TYPE_CHECKING:
    from hpcmem.collectives.options import Options

HELP = "latency of MPI collectives (OSU-style) on NumPy, HBW and MPI_Alloc_mem buffers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem collectives``."""
    add = parser.add_argument
    add(
        "--op",
        metavar="LIST",
        default=DEFAULT_OPS,
        help=f"comma list of: {', '.join(OPS)} (default {DEFAULT_OPS})",
    )
    add(
        "--buffer",
        metavar="LIST",
        default="numpy",
        help=f"comma list of: {', '.join(BUFFER_KINDS)} (default numpy)",
    )
    add(
        "--min-size",
        metavar="SIZE",
        help="smallest message, e.g. 8, 4K (default: one element of --dtype)",
    )
    add(
        "--max-size",
        metavar="SIZE",
        default=DEFAULT_MAX_SIZE,
        help=f"largest message (default {DEFAULT_MAX_SIZE}; at most 2^30 elements of "
        "--dtype, 4G of float32: a count every MPI library takes)",
    )
    add(
        "--iterations",
        metavar="N",
        help=f"timed iterations per size (default as OSU: {OSU_ITERATIONS}, "
        f"{OSU_ITERATIONS_LARGE} above {LARGE_MESSAGE_SIZE} bytes)",
    )
    add(
        "--warmup",
        metavar="N",
        help=f"untimed iterations before timing (default as OSU: {OSU_WARMUP}, "
        f"{OSU_WARMUP_LARGE} above {LARGE_MESSAGE_SIZE} bytes)",
    )
    add(
        "--repeats",
        metavar="N",
        help="independent timed loops per point (default 1); records keep every repeat's "
        "figures, and their medians",
    )
    add(
        "--dtype",
        metavar="NAME",
        default="float32",
        help=f"element type: {', '.join(DTYPES)} (default float32)",
    )
    add(
        "--numpy-hugepage",
        metavar="on|off",
        help="NumPy's huge-page advice for numpy buffers (default: on when "
        "NUMPY_MADVISE_HUGEPAGE is set and not 0, else off, like OSU's malloc'd buffers)",
    )
    add(
        "--thread-level",
        metavar="LEVEL",
        default="single",
        help=f"MPI thread level asked for: {', '.join(THREAD_LEVELS)} (default single, as "
        "OSU's MPI_Init; mpi4py's own default, multiple, makes Open MPI lock per message)",
    )
    add(
        "--native-loop",
        metavar="on|off",
        default="on",
        help="also time every point with the native C loop on the same buffers, so "
        "records carry Python's overhead (default on)",
    )
    add("--output", metavar="FILE", help="write JSONL records here (atomically; rank 0)")
    add(
        "--run-id",
        metavar="ID",
        help="run identifier stored in every record (default: HPCMEM_RUN_ID or random)",
    )


def options_from_args(args: argparse.Namespace) -> Options:
    """The validated :class:`hpcmem.collectives.options.Options`; UsageError names a bad one."""
    from hpcmem.collectives.options import OptionsError, make_options

    with bad_input(OptionsError):
        return make_options(
            op=args.op, buffer=args.buffer, min_size=args.min_size, max_size=args.max_size,
            iterations=args.iterations, warmup=args.warmup, repeats=args.repeats,
            dtype=args.dtype, numpy_hugepage=args.numpy_hugepage, thread_level=args.thread_level,
            native_loop=args.native_loop, run_id=args.run_id,
        )


def _print(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    """Validate options, run on MPI_COMM_WORLD, write records; 1 when a check failed."""
    launcher_rank = global_rank()  # before MPI starts; RankError (exit 2) when not a rank
    try:
        options = options_from_args(args)
        hbw_nodes()  # a MEMKIND_HBW_NODES naming what is not here: refused before any work
    except (UsageError, IdListError):
        if launcher_rank in (None, 0):
            raise
        return 2  # rank 0 reports the same error once
    try:
        import mpi4py

        mpi4py.rc.thread_level = options.knobs.thread_level  # read when MPI starts, at the import
        from mpi4py import MPI
    except ImportError as error:
        print(
            f"hpcmem collectives: error: mpi4py is not importable ({error}); install it built "
            "against this node's MPI: pip install --no-binary mpi4py 'hpcmem[mpi]'",
            file=sys.stderr,
        )
        return 1

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    problem = _agreed(comm, lambda: args.output and check_output_file(args.output))
    if problem:
        if rank == 0:
            raise UsageError(f"--output: {problem}")
        return 2
    try:
        return _measure_and_write(comm, options, args.output)
    except Exception:  # any rank failing alone would leave the others waiting forever
        if comm.Get_size() == 1:
            raise
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
        raise


def _agreed(comm: Any, step: Callable[[], Any]) -> str | None:
    """Run ``step`` on rank 0; every rank gets its OutputPathError message, or None."""
    problem = None
    if comm.Get_rank() == 0:
        try:
            step()
        except OutputPathError as error:
            problem = str(error)
    return comm.bcast(problem, root=0)


def _measure_and_write(comm: Any, options: Options, output: str | None) -> int:
    """Measure, write the records on rank 0; every rank returns rank 0's exit code."""
    from hpcmem.collectives.benchmark import exit_code
    from hpcmem.collectives.benchmark import run as run_benchmark
    from hpcmem.record.jsonl import write_records

    rank = comm.Get_rank()
    records = run_benchmark(comm, options, _print if rank == 0 else _discard)

    def write() -> None:
        if output:
            with write_errors(output):
                write_records(output, records)

    problem = _agreed(comm, write)
    if problem:
        if rank == 0:
            print(f"hpcmem collectives: error: --output: {problem}", file=sys.stderr)
        return 2
    code = exit_code(records) if rank == 0 else 0
    if code:
        print(
            "hpcmem collectives: error: a result differed from its reference "
            "(see the 'failed' lines above)",
            file=sys.stderr,
        )
    return comm.bcast(code, root=0)


def _discard(line: str) -> None:
    return None
