"""The collective operations: buffer layout, the MPI call, bandwidth factors and a reference.

Message sizes follow OSU's C suite: ``size`` is the bytes each rank contributes
(bcast, reduce, allreduce: the whole vector; gather, allgather, scatter: one
rank's block; alltoall: the block sent to each peer; reduce_scatter: the whole
input vector, split as evenly as possible among the ranks).

Bandwidth follows nccl-tests: ``algbw = data_bytes / time`` with ``data_bytes``
the largest buffer a rank handles (``data_factor * size``), and
``busbw = algbw * bus_factor``: allreduce 2(n-1)/n; allgather, reduce_scatter,
alltoall (n-1)/n; bcast and reduce 1. Gather and scatter use (n-1)/n like
allgather: the root moves the (n-1) blocks that are not its own. Barrier moves
no data (0).

Every rank's input is ``rank_input(rank, length)``: small positive integers,
different per rank and per position, exact in every supported dtype so sums
are exact and the reference computed here in NumPy must match bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DTYPES",
    "OPS",
    "ROOT",
    "SENTINEL",
    "Op",
    "check",
    "datatype",
    "rank_input",
    "split_counts",
]

#: --dtype names accepted (NumPy names; mpi4py maps them to MPI datatypes)
DTYPES = ("float32", "float64", "int32", "int64")
#: the root rank of the rooted collectives (bcast, gather, reduce, scatter), as in OSU
ROOT = 0
#: written into receive buffers before the validation call, so a missing write shows
SENTINEL = -1
_PERIOD = 8191  # input values lie in 1..8191: sums over 2048 ranks stay exact in float32
_RANK_SHIFT = 7919


def rank_input(rank: int, length: int, dtype: Any = np.float64) -> np.ndarray:
    """The values rank ``rank`` sends: ``(i + 7919 * rank) % 8191 + 1`` for ``i < length``."""
    index = np.arange(length, dtype=np.int64)
    return ((index + _RANK_SHIFT * rank) % _PERIOD + 1).astype(dtype)


def split_counts(count: int, ranks: int) -> list[int]:
    """Elements per rank in reduce_scatter: an even split, the remainder to the first ranks."""
    base, extra = divmod(count, ranks)
    return [base + (1 if rank < extra else 0) for rank in range(ranks)]


def _sum(count: int, ranks: int) -> np.ndarray:
    return sum((rank_input(r, count, np.int64) for r in range(ranks)), np.zeros(count, np.int64))


def _concat(count: int, ranks: int) -> np.ndarray:
    return np.concatenate([rank_input(r, count, np.int64) for r in range(ranks)])


#: (count, ranks, rank, root) -> lengths of (send, recv) buffers; None: no buffer on this rank
Layout = Callable[[int, int, int, int], tuple[int | None, int | None]]
#: (count, ranks, rank, root) -> the values this rank must hold after the call, or None
Reference = Callable[[int, int, int, int], np.ndarray | None]
#: a message as mpi4py takes it: ``[array, datatype]`` (see :func:`datatype`), or None
Buf = list | None
Call = Callable[[], Any]
#: (comm, send, recv, count, ranks, root, MPI) -> a no-argument callable doing one operation
Binder = Callable[..., Call]


@dataclass(frozen=True)
class Op:
    """One collective: how its buffers are laid out, how it is called, what it must produce."""

    name: str
    title: str  # the word in OSU's header: "# OSU MPI <title> Latency Test"
    layout: Layout
    bind: Binder
    reference: Reference
    data_factor: Callable[[int], int]
    bus_factor: Callable[[int], float]
    sized: bool = True  # False for barrier: no message, no size column

    def prepare(
        self, comm: Any, send: Any, recv: Any, count: int, ranks: int, root: int, mpi: Any
    ) -> Call:
        """One call of this op on these arrays (None: no buffer on this rank), prebound to
        ``[array, datatype]`` messages so no call parses the arrays' format again."""
        return self.bind(comm, _message(send, mpi), _message(recv, mpi), count, ranks, root, mpi)

    def data_bytes(self, size: int, ranks: int) -> int:
        """Bytes behind algbw (nccl-tests' convention) for a message of ``size`` bytes."""
        return self.data_factor(ranks) * size if self.sized else 0


def datatype(array: np.ndarray, mpi: Any) -> Any:
    """The predefined MPI datatype mpi4py itself passes for ``array`` (by its typecode)."""
    return mpi._typedict[array.dtype.char]


def _message(array: np.ndarray | None, mpi: Any) -> Buf:
    return None if array is None else [array, datatype(array, mpi)]


def _one(_: int) -> int:
    return 1


def _ranks(n: int) -> int:
    return n


def _unit(_: int) -> float:
    return 1.0


def _ring(n: int) -> float:
    return (n - 1) / n


def _allreduce_bus(n: int) -> float:
    return 2 * (n - 1) / n


def _root_only(length: int, rank: int, root: int) -> int | None:
    return length if rank == root else None


def _bcast_ref(count: int, n: int, rank: int, root: int) -> np.ndarray:
    return rank_input(root, count, np.int64)


def _gather_ref(count: int, n: int, rank: int, root: int) -> np.ndarray | None:
    return _concat(count, n) if rank == root else None


def _alltoall_ref(count: int, n: int, rank: int, root: int) -> np.ndarray:
    blocks = [
        rank_input(src, n * count, np.int64)[rank * count : (rank + 1) * count] for src in range(n)
    ]
    return np.concatenate(blocks)


def _scatter_ref(count: int, n: int, rank: int, root: int) -> np.ndarray:
    return rank_input(root, n * count, np.int64)[rank * count : (rank + 1) * count]


def _reduce_scatter_ref(count: int, n: int, rank: int, root: int) -> np.ndarray:
    counts = split_counts(count, n)
    start = sum(counts[:rank])
    return _sum(count, n)[start : start + counts[rank]]


def _bind_bcast(comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any) -> Call:
    return functools.partial(comm.Bcast, send if send is not None else recv, root)


def _bind_rooted(method: str) -> Binder:
    def bind(comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any) -> Call:
        return functools.partial(getattr(comm, method), send, recv, root)

    return bind


def _bind_reduce(comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any) -> Call:
    return functools.partial(comm.Reduce, send, recv, mpi.SUM, root)


def _bind_allreduce(
    comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any
) -> Call:
    return functools.partial(comm.Allreduce, send, recv, mpi.SUM)


def _bind_pair(method: str) -> Binder:
    def bind(comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any) -> Call:
        return functools.partial(getattr(comm, method), send, recv)

    return bind


def _bind_reduce_scatter(
    comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any
) -> Call:
    return functools.partial(comm.Reduce_scatter, send, recv, split_counts(count, n), mpi.SUM)


def _bind_barrier(comm: Any, send: Buf, recv: Buf, count: int, n: int, root: int, mpi: Any) -> Call:
    return comm.Barrier


_OPS = (
    Op(
        "bcast",
        "Broadcast",
        lambda c, n, r, root: (c, None) if r == root else (None, c),
        _bind_bcast,
        _bcast_ref,
        _one,
        _unit,
    ),
    Op(
        "gather",
        "Gather",
        lambda c, n, r, root: (c, _root_only(n * c, r, root)),
        _bind_rooted("Gather"),
        _gather_ref,
        _ranks,
        _ring,
    ),
    Op(
        "allreduce",
        "Allreduce",
        lambda c, n, r, root: (c, c),
        _bind_allreduce,
        lambda c, n, r, root: _sum(c, n),
        _one,
        _allreduce_bus,
    ),
    Op(
        "reduce",
        "Reduce",
        lambda c, n, r, root: (c, _root_only(c, r, root)),
        _bind_reduce,
        lambda c, n, r, root: _sum(c, n) if r == root else None,
        _one,
        _unit,
    ),
    Op(
        "allgather",
        "Allgather",
        lambda c, n, r, root: (c, n * c),
        _bind_pair("Allgather"),
        lambda c, n, r, root: _concat(c, n),
        _ranks,
        _ring,
    ),
    Op(
        "alltoall",
        "All-to-All Personalized Exchange",
        lambda c, n, r, root: (n * c, n * c),
        _bind_pair("Alltoall"),
        _alltoall_ref,
        _ranks,
        _ring,
    ),
    Op(
        "scatter",
        "Scatter",
        lambda c, n, r, root: (_root_only(n * c, r, root), c),
        _bind_rooted("Scatter"),
        _scatter_ref,
        _ranks,
        _ring,
    ),
    Op(
        "reduce_scatter",
        "Reduce_scatter",
        lambda c, n, r, root: (c, split_counts(c, n)[r]),
        _bind_reduce_scatter,
        _reduce_scatter_ref,
        _one,
        _ring,
    ),
    Op(
        "barrier",
        "Barrier",
        lambda c, n, r, root: (None, None),
        _bind_barrier,
        lambda c, n, r, root: None,
        _one,
        lambda n: 0.0,
        sized=False,
    ),
)

#: name -> Op, in the order of OSU's collective benchmarks list
OPS: dict[str, Op] = {op.name: op for op in _OPS}


def check(op: str, result: np.ndarray | None, expected: np.ndarray | None) -> str | None:
    """Compare a rank's result with the reference; None when equal, else the reason."""
    if expected is None:
        return None
    if result is None or result.shape != expected.shape:
        got = None if result is None else result.shape
        return f"{op}: result shape {got} differs from the reference shape {expected.shape}"
    wrong = np.flatnonzero(result != expected.astype(result.dtype))
    if wrong.size == 0:
        return None
    first = int(wrong[0])
    return (
        f"{op}: {wrong.size} of {result.size} elements differ from the reference "
        f"(first at index {first}: got {result[first]!r}, expected {expected[first]!r})"
    )
