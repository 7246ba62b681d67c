"""Buffer kinds for the collectives: where the send and receive arrays come from.

``numpy`` is NumPy's own heap (its huge-page advice controlled by
:func:`set_numpy_hugepage`), the ``hbw*`` kinds come from memkind through
:mod:`hpcmem.hbw`, and ``mpi_alloc`` from ``MPI.Alloc_mem`` (which reaches
memkind only in an Open MPI built with its memkind component).
"""

from __future__ import annotations

import mmap
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from hpcmem.errors import HpcmemError
from hpcmem.hbw import HBW_KINDS

__all__ = [
    "BUFFER_KINDS",
    "PAGE_SIZE",
    "BufferUnavailableError",
    "allocate",
    "memory_settings",
    "set_numpy_hugepage",
]

#: NumPy's own heap, memkind's high-bandwidth kinds, MPI_Alloc_mem
BUFFER_KINDS = ("numpy", *HBW_KINDS, "mpi_alloc")
#: every buffer starts on a boundary of this many bytes
PAGE_SIZE = mmap.PAGESIZE
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


class BufferUnavailableError(HpcmemError):
    """This kind of memory cannot be had on this node; the points become ``skipped``."""


def set_numpy_hugepage(enabled: bool) -> bool:
    """Set NumPy's huge-page advice (as ``NUMPY_MADVISE_HUGEPAGE`` does); returns the old value."""
    from numpy._core import multiarray

    return bool(multiarray._set_madvise_hugepage(enabled))


def memory_settings() -> dict[str, Any]:
    """The huge-page settings that shape NumPy buffers, as recorded with every point."""
    from numpy._core import multiarray

    try:
        text = _THP.read_text()
        thp = text[text.index("[") + 1 : text.index("]")]
    except (OSError, ValueError):
        thp = None
    return {
        "numpy_madvise_hugepage": bool(multiarray._get_madvise_hugepage()),
        "transparent_hugepage": thp,
    }


def _mpi_alloc(length: int, dtype: np.dtype, stack: ExitStack) -> np.ndarray:
    from mpi4py import MPI

    nbytes = length * dtype.itemsize
    try:
        memory = MPI.Alloc_mem(nbytes)
    except MPI.Exception as error:  # MPI_ERR_NO_MEM: more than the node can give, as numpy's
        raise MemoryError(f"MPI_Alloc_mem of {nbytes} bytes: {error}") from None
    array = np.frombuffer(memory, dtype=dtype)
    stack.callback(MPI.Free_mem, memory)
    return array


def _hbw(kind: str, length: int, dtype: np.dtype) -> np.ndarray:
    from hpcmem import hbw

    try:
        with warnings.catch_warnings():
            # hbw_preferred without an HBW node falls back to DRAM: the measured
            # placement of every point records where the pages landed
            warnings.simplefilter("ignore", hbw.HBWFallbackWarning)
            return hbw.empty((length,), dtype, kind=kind)
    except hbw.KindUnavailableError as error:
        raise BufferUnavailableError(str(error)) from None


def _bytes(kind: str, nbytes: int, stack: ExitStack) -> np.ndarray:
    if kind == "numpy":
        return np.empty(nbytes, np.uint8)
    if kind == "mpi_alloc":
        return _mpi_alloc(nbytes, np.dtype(np.uint8), stack)
    return _hbw(kind, nbytes, np.dtype(np.uint8))


def allocate(kind: str, length: int, dtype: Any, stack: ExitStack) -> np.ndarray:
    """A 1-D array of ``length`` elements of ``kind`` memory starting on a page boundary,
    alive until ``stack`` closes (a view into one page more of that memory).

    Raises :class:`BufferUnavailableError` when the kind cannot be had on this node
    and ValueError for an unknown kind.
    """
    dtype = np.dtype(dtype)
    if kind not in BUFFER_KINDS:
        raise ValueError(f"buffer kind {kind!r} is not one of {', '.join(BUFFER_KINDS)}")
    if length == 0:
        return np.empty(0, dtype)
    nbytes = length * dtype.itemsize
    memory = _bytes(kind, nbytes + PAGE_SIZE, stack)
    start = -memory.ctypes.data % PAGE_SIZE
    return memory[start : start + nbytes].view(dtype)
