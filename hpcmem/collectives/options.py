"""One collectives run as asked for: its sweep, its knobs and its test hooks, validated.

The :class:`Sweep` is what is measured (ops x buffer kinds x sizes, in one element type),
the :class:`Knobs` how every point is measured, the :class:`TestHooks` what a test does on
purpose (:mod:`hpcmem.collectives.slowdown`). Runs come from ``hpcmem collectives``, so a
value that is not accepted raises :class:`OptionsError` naming that command's option, the
value and what is accepted. A message holds at most :data:`MAX_MESSAGE_ELEMENTS` elements,
a count every MPI library takes (MPI-3 counts in a C ``int``); a size that is accepted but
more than the node can allocate is a runtime matter: its points are recorded ``skipped``,
with the reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES, OPS, Op
from hpcmem.collectives.sizes import osu_counts, size_steps
from hpcmem.collectives.slowdown import SlowdownError, TestHooks
from hpcmem.errors import HpcmemError
from hpcmem.node.planned import SKIP_ENV
from hpcmem.units import UnitError, format_size, parse_size

__all__ = ["DEFAULT_MAX_SIZE", "DEFAULT_OPS", "HUGEPAGE_ENV", "MAX_MESSAGE_ELEMENTS",
           "THREAD_LEVELS", "Knobs", "Options", "OptionsError", "Sweep", "make_options"]

DEFAULT_OPS = "bcast,gather,allreduce"
DEFAULT_MAX_SIZE = "1M"
#: the most elements of one message: the largest power of two a C int holds, so that every
#: MPI library can count them (an MPI-3 library refuses more, at the first call)
MAX_MESSAGE_ELEMENTS = 1 << 30
#: NumPy's own switch of its huge-page advice; the default of ``numpy_hugepage``
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"
#: MPI thread levels as mpi4py.rc.thread_level spells them; ``single`` is what OSU's MPI_Init
#: gets, mpi4py's own default ``multiple`` makes Open MPI lock on every message
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


class OptionsError(HpcmemError, ValueError):
    """A collectives option whose value is not accepted; the message names the option."""


@dataclass(frozen=True)
class Sweep:
    """What a run measures: every op x buffer kind x size, in one element type."""

    ops: tuple[str, ...]
    buffers: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str = "float32"

    def sizes_of(self, op: Op) -> tuple[int, ...]:
        """The sizes ``op`` is measured at: the sweep's, or one (0) when it moves no data."""
        return self.sizes if op.sized else (0,)


@dataclass(frozen=True)
class Knobs:
    """How every point of a run is measured."""

    iterations: int | None = None  # None: OSU's default for each size
    warmup: int | None = None
    repeats: int = 1  # independent timed loops per point, each one full timed loop
    numpy_hugepage: bool = False
    #: requested before MPI starts (by ``hpcmem collectives``); records hold what MPI provided
    thread_level: str = "single"
    native_loop: bool = True  # also time every point with the native C loop

    def counts(self, size: int) -> tuple[int, int]:
        """``(iterations, warmup)`` at ``size``: the ones asked for, else OSU's defaults."""
        return osu_counts(size, self.iterations, self.warmup)


@dataclass(frozen=True)
class Options:
    """One collectives run, validated: its sweep, knobs and test hooks, run id and skip reason."""

    sweep: Sweep
    knobs: Knobs
    hooks: TestHooks
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


def _accepted_sizes(dtype: str) -> str:
    """The accepted range of message sizes in ``dtype``, as the options' messages say it."""
    itemsize = np.dtype(dtype).itemsize
    return (f"{format_size(itemsize)} to {format_size(MAX_MESSAGE_ELEMENTS * itemsize)} for "
            f"{dtype} (at most 2^30 elements, a count every MPI library takes)")


def _size(option: str, text: str, dtype: str) -> int:
    """Bytes in ``text``, at most :data:`MAX_MESSAGE_ELEMENTS` of ``dtype``; OptionsError
    names the option, the value and the accepted range."""
    try:
        value = parse_size(text)
    except UnitError as error:
        raise OptionsError(
            f"{option}: {error}; the accepted range is {_accepted_sizes(dtype)}") from None
    if value > MAX_MESSAGE_ELEMENTS * np.dtype(dtype).itemsize:
        raise OptionsError(f"{option}: {text!r} is {value} bytes, outside the accepted range "
                           f"{_accepted_sizes(dtype)}")
    return value


def _sweep(op: str, buffer: str, dtype: str, min_size: str | None, max_size: str) -> Sweep:
    """The sweep these option texts describe; OptionsError names the first bad one."""
    ops = _names("--op", op, tuple(OPS))
    kinds = _names("--buffer", buffer, BUFFER_KINDS)
    if dtype not in DTYPES:
        raise OptionsError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    itemsize = np.dtype(dtype).itemsize
    smallest = itemsize if min_size is None else _size("--min-size", min_size, dtype)
    largest = _size("--max-size", max_size, dtype)
    if smallest < itemsize or smallest % itemsize:
        raise OptionsError(
            f"--min-size: {smallest} bytes is not a positive multiple of one {dtype} "
            f"element ({itemsize} bytes)"
        )
    if largest < smallest:
        raise OptionsError(
            f"--max-size: {largest} bytes is smaller than --min-size ({smallest} bytes)"
        )
    return Sweep(ops, kinds, tuple(size_steps(smallest, largest)), dtype)


def _knobs(iterations: str | None, warmup: str | None, repeats: str | None,
           numpy_hugepage: str | None, thread_level: str, native_loop: str) -> Knobs:
    """The knobs these option texts describe; OptionsError names the first bad one."""
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
    return Knobs(
        iterations=_count("--iterations", iterations, 1),
        warmup=_count("--warmup", warmup, 0),
        repeats=_count("--repeats", repeats, 1) or 1,
        numpy_hugepage=hugepage == "on",
        thread_level=thread_level,
        native_loop=native_loop == "on",
    )


def make_options(
    *,
    op: str = DEFAULT_OPS,
    buffer: str = "numpy",
    min_size: str | None = None,
    max_size: str = DEFAULT_MAX_SIZE,
    iterations: str | None = None,
    warmup: str | None = None,
    repeats: str | None = None,
    dtype: str = "float32",
    numpy_hugepage: str | None = None,
    thread_level: str = "single",
    native_loop: str = "on",
    run_id: str | None = None,
) -> Options:
    """The run these option texts describe (comma lists of ops and buffer kinds, sizes such as
    ``4K``); ``min_size`` defaults to one element of ``dtype``, ``numpy_hugepage`` (on or off)
    to ``NUMPY_MADVISE_HUGEPAGE``, ``repeats`` to 1; ``native_loop`` is on or off.
    ``HPCMEM_SKIP_REASON`` (set by ``hpcmem bind --skip-unavailable``) becomes the skip
    reason, ``HPCMEM_TEST_SLOWDOWN`` the test hooks (:mod:`hpcmem.collectives.slowdown`).
    Raises :class:`OptionsError`."""
    sweep = _sweep(op, buffer, dtype, min_size, max_size)
    knobs = _knobs(iterations, warmup, repeats, numpy_hugepage, thread_level, native_loop)
    if run_id is not None and not run_id.strip():
        raise OptionsError(f"--run-id: {run_id!r} is blank; give a non-empty identifier")
    try:
        hooks = TestHooks.from_environment()
    except SlowdownError as error:
        raise OptionsError(str(error)) from None
    return Options(sweep, knobs, hooks, run_id=run_id,
                   skip_reason=os.environ.get(SKIP_ENV, "").strip() or None)
