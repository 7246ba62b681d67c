"""The native timing loop: OSU's C loop (``hpcmem._timing``) over mpi4py's buffers.

It times the very call the mpi4py loop of :mod:`hpcmem.collectives.timing` times, on the
same communicator (``PyMPIComm_Get``), buffers, datatype and reduction, with the same
warm-up, barriers and ``MPI_Wtime`` reads, but without the Python interpreter between
the calls: the difference between the two figures is Python's cost, measured.

``hpcmem._timing`` is built only where the MPI C headers and mpi4py's C API header were
found at build time; :func:`unavailable` then says why it is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

from hpcmem.collectives.ops import Op, datatype, split_counts
from hpcmem.errors import HpcmemError

__all__ = ["NativeLoopUnavailableError", "rank_latency", "unavailable"]

INSTALL_HINT = (
    "install the MPI C headers and mpi4py, then rebuild: apt-get install libopenmpi-dev "
    "(RHEL/Rocky: dnf install openmpi-devel), pip install --no-binary mpi4py mpi4py, "
    "then `make native` or `pip install --no-build-isolation .`"
)


class NativeLoopUnavailableError(HpcmemError, RuntimeError):
    """hpcmem._timing cannot be loaded: built without MPI headers or mpi4py."""


def _native() -> ModuleType:
    try:
        return importlib.import_module("hpcmem._timing")
    except ImportError as error:
        raise NativeLoopUnavailableError(
            f"the native timing loop hpcmem._timing is not built ({error}); {INSTALL_HINT}"
        ) from None


def unavailable() -> str | None:
    """None when the native loop can run here, else why it cannot."""
    try:
        _native()
    except NativeLoopUnavailableError as error:
        return str(error)
    return None


def rank_latency(
    comm: Any,
    op: Op,
    send: np.ndarray | None,
    recv: np.ndarray | None,
    count: int,
    root: int,
    iterations: int,
    warmup: int,
) -> float:
    """This rank's mean seconds per call of ``op`` timed in C, as
    :func:`hpcmem.collectives.timing.rank_latency` times ``op.prepare(...)`` in Python."""
    from mpi4py import MPI

    array = send if send is not None else recv
    counts = split_counts(count, comm.Get_size()) if op.name == "reduce_scatter" else []
    return _native().rank_latency(
        comm, op.name, send, recv, count,
        MPI.BYTE if array is None else datatype(array, MPI), MPI.SUM, root, counts,
        iterations, warmup, op.sized,
    )  # fmt: skip
