"""One collectives run as asked for: the sweep axes and the knobs, validated.

Runs come from ``hpcmem collectives``, so a value that is not accepted raises
:class:`OptionsError` naming that command's option, the value and what is accepted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES, OPS
from hpcmem.collectives.sizes import size_steps
from hpcmem.errors import HpcmemError
from hpcmem.node.planned import SKIP_ENV
from hpcmem.units import UnitError, parse_size

__all__ = ["DEFAULT_MAX_SIZE", "DEFAULT_OPS", "HUGEPAGE_ENV", "THREAD_LEVELS", "Options",
           "OptionsError", "make_options"]

DEFAULT_OPS = "bcast,gather,allreduce"
DEFAULT_MAX_SIZE = "1M"
#: NumPy's own switch of its huge-page advice; the default of ``numpy_hugepage``
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"
#: MPI thread levels as mpi4py.rc.thread_level spells them; ``single`` is what OSU's MPI_Init
#: gets, mpi4py's own default ``multiple`` makes Open MPI lock on every message
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


class OptionsError(HpcmemError, ValueError):
    """A collectives option whose value is not accepted; the message names the option."""


@dataclass(frozen=True)
class Options:
    """One collectives run: the sweep axes and the knobs, already validated."""

    ops: tuple[str, ...]
    buffers: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str = "float32"
    iterations: int | None = None  # None: OSU's default for each size
    warmup: int | None = None
    numpy_hugepage: bool = False
    #: requested before MPI starts (by ``hpcmem collectives``); records hold what MPI provided
    thread_level: str = "single"
    native_loop: bool = True  # also time every point with the native C loop
    run_id: str | None = None
    skip_reason: str | None = None  # set: run nothing, record every point as skipped


def _names(option: str, text: str, accepted: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if name not in accepted:
            raise OptionsError(f"{option}: {name!r} is not one of {', '.join(accepted)}")
    if len(set(names)) != len(names):
        raise OptionsError(f"{option}: {text!r} names an entry twice")
    return names


def _count(option: str, text: str | None, minimum: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise OptionsError(f"{option}: {text!r} is not an integer >= {minimum}")
    return value


def _size(option: str, text: str) -> int:
    try:
        return parse_size(text)
    except UnitError as error:
        raise OptionsError(f"{option}: {error}") from None


def make_options(
    *,
    op: str = DEFAULT_OPS,
    buffer: str = "numpy",
    min_size: str | None = None,
    max_size: str = DEFAULT_MAX_SIZE,
    iterations: str | None = None,
    warmup: str | None = None,
    dtype: str = "float32",
    numpy_hugepage: str | None = None,
    thread_level: str = "single",
    native_loop: str = "on",
    run_id: str | None = None,
) -> Options:
    """The run these option texts describe (comma lists of ops and buffer kinds, sizes such as
    ``4K``); ``min_size`` defaults to one element of ``dtype``, ``numpy_hugepage`` (on or off)
    to ``NUMPY_MADVISE_HUGEPAGE``; ``native_loop`` is on or off. ``HPCMEM_SKIP_REASON`` (set
    by ``hpcmem bind --skip-unavailable``) becomes the skip reason. Raises
    :class:`OptionsError`."""
    ops = _names("--op", op, tuple(OPS))
    kinds = _names("--buffer", buffer, BUFFER_KINDS)
    if dtype not in DTYPES:
        raise OptionsError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    itemsize = np.dtype(dtype).itemsize
    smallest = itemsize if min_size is None else _size("--min-size", min_size)
    largest = _size("--max-size", max_size)
    if smallest < itemsize or smallest % itemsize:
        raise OptionsError(
            f"--min-size: {smallest} bytes is not a positive multiple of one {dtype} "
            f"element ({itemsize} bytes)"
        )
    if largest < smallest:
        raise OptionsError(
            f"--max-size: {largest} bytes is smaller than --min-size ({smallest} bytes)"
        )
    hugepage = numpy_hugepage
    if hugepage is None:
        hugepage = "off" if os.environ.get(HUGEPAGE_ENV, "0").strip() in ("0", "") else "on"
    if hugepage not in ("on", "off"):
        raise OptionsError(f"--numpy-hugepage: {hugepage!r} is not one of on, off")
    if thread_level not in THREAD_LEVELS:
        raise OptionsError(
            f"--thread-level: {thread_level!r} is not one of {', '.join(THREAD_LEVELS)}")
    if native_loop not in ("on", "off"):
        raise OptionsError(f"--native-loop: {native_loop!r} is not one of on, off")
    if run_id is not None and not run_id.strip():
        raise OptionsError(f"--run-id: {run_id!r} is blank; give a non-empty identifier")
    return Options(
        ops=ops,
        buffers=kinds,
        sizes=tuple(size_steps(smallest, largest)),
        dtype=dtype,
        iterations=_count("--iterations", iterations, 1),
        warmup=_count("--warmup", warmup, 0),
        numpy_hugepage=hugepage == "on",
        thread_level=thread_level,
        native_loop=native_loop == "on",
        run_id=run_id,
        skip_reason=os.environ.get(SKIP_ENV, "").strip() or None,
    )
