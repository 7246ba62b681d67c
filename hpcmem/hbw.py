"""NumPy arrays in high-bandwidth memory (and other tiers) through memkind.

Kinds: ``dram`` (MEMKIND_DEFAULT), ``hbw`` (MEMKIND_HBW: an error without an HBW
node), ``hbw_preferred`` (HBW, falling back to DRAM with a warning),
``hbw_interleave`` (pages interleaved over the HBW nodes) and ``dax_kmem`` (CXL or
persistent memory exposed as system RAM, MEMKIND_DAX_KMEM).

Examples
--------
>>> from hpcmem import hbw
>>> a = hbw.zeros((1024, 1024), dtype="float32", kind="hbw_preferred")
>>> hbw.placement(a).to_record()["nodes"]          # doctest: +SKIP
{'0': 1025}
>>> with hbw.allocator("hbw_preferred"):           # every array made here
...     b = a + 1                                   # comes from memkind
"""

from __future__ import annotations

import contextlib
import math
import operator
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from hpcmem.errors import HpcmemError
from hpcmem.node import topology

__all__ = [
    "HBW_KINDS",
    "KINDS",
    "HBWFallbackWarning",
    "HBWUnavailableError",
    "KindUnavailableError",
    "MemkindNotBuiltError",
    "Placement",
    "allocator",
    "empty",
    "empty_like",
    "handler_name",
    "kind_of",
    "memkind_version",
    "placement",
    "resolve_kind",
    "verify",
    "zeros",
]

KINDS = ("dram", "hbw", "hbw_preferred", "hbw_interleave", "dax_kmem")
HBW_KINDS = ("hbw", "hbw_preferred", "hbw_interleave")
HANDLER_PREFIX = "hpcmem_memkind_"
INSTALL_HINT = (
    "install memkind and rebuild: apt-get install libmemkind-dev libnuma-dev "
    "(RHEL/Rocky: dnf install memkind-devel numactl-devel), then `make native` "
    "or `pip install .`"
)


class KindUnavailableError(HpcmemError, RuntimeError):
    """A memory kind cannot allocate on this machine."""


class HBWUnavailableError(KindUnavailableError):
    """``hbw`` or ``hbw_interleave`` was asked for and there is no HBW node."""


class MemkindNotBuiltError(KindUnavailableError):
    """hpcmem._hbw cannot be loaded (built without memkind, or memkind is gone)."""


class HBWFallbackWarning(UserWarning):
    """``hbw_preferred`` found no HBW node and took the memory from DRAM."""


def _native() -> ModuleType:
    try:
        from hpcmem import _hbw
    except ImportError as error:
        raise MemkindNotBuiltError(
            f"hpcmem._hbw cannot be loaded ({error}): hpcmem was built without memkind "
            f"or memkind is gone; {INSTALL_HINT}"
        ) from None
    return _hbw


def memkind_version() -> str:
    """The memkind version hpcmem runs with, e.g. ``'1.14.0'``."""
    return _native().memkind_version()


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside hpcmem.hbw."""
    internal = (__file__, contextlib.__file__)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename in internal:
        frame, level = frame.f_back, level + 1
    return level


def resolve_kind(kind: str) -> str:
    """The kind that will serve a request for ``kind`` on this machine.

    ``hbw_preferred`` without an HBW node resolves to ``dram`` and warns
    (:class:`HBWFallbackWarning`); an unavailable ``hbw``/``hbw_interleave`` raises
    :class:`HBWUnavailableError`, an unavailable ``dax_kmem``
    :class:`KindUnavailableError`; an unknown kind raises ValueError.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    code = _native().check_available(kind)
    if code == 0:
        return kind
    if kind == "hbw_preferred":
        warnings.warn(
            "kind 'hbw_preferred': no high-bandwidth NUMA node, the memory comes from DRAM "
            "(declare HBW nodes with MEMKIND_HBW_NODES=<nodes>)",
            HBWFallbackWarning,
            stacklevel=_caller_stacklevel(),
        )
        return "dram"
    if kind in HBW_KINDS:
        raise HBWUnavailableError(
            f"kind {kind!r}: no high-bandwidth NUMA node on this machine (memkind error {code}); "
            "declare HBW nodes with MEMKIND_HBW_NODES=<nodes> (on DRAM nodes results are "
            "labelled emulated), or use kind='hbw_preferred', which falls back to DRAM"
        )
    if kind == "dax_kmem":
        raise KindUnavailableError(
            f"kind 'dax_kmem': no DAX KMEM (CXL or persistent memory as system RAM) NUMA node "
            f"(memkind error {code}); declare one with MEMKIND_DAX_KMEM_NODES=<nodes>"
        )
    raise KindUnavailableError(f"kind {kind!r}: memkind reports it unavailable (error {code})")


def _shape(shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(d) for d in (shape if np.iterable(shape) else (shape,)))
    except TypeError:
        raise TypeError(f"shape {shape!r}: dimensions must be integers") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {shape!r}: negative dimensions are not allowed")
    return dims


def _new(shape: Any, dtype: Any, kind: str, order: str, zero: bool) -> np.ndarray:
    dims = _shape(shape)
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"dtype {dt}: arrays of Python objects cannot live in memkind memory")
    if order not in ("C", "F"):
        raise ValueError(f"order {order!r} is not one of C, F")
    nbytes = math.prod(dims) * dt.itemsize
    served = resolve_kind(kind)
    if nbytes > np.iinfo(np.intp).max:
        raise MemoryError(f"memkind kind {served!r}: cannot allocate {nbytes} bytes")
    buffer = _native().Buffer(served, nbytes, zero)
    return np.ndarray(dims, dtype=dt, buffer=buffer, order=order)


def empty(shape: Any, dtype: Any = float, kind: str = "hbw", *, order: str = "C") -> np.ndarray:
    """An uninitialised array whose memory comes from memkind ``kind``.

    The memory is returned to memkind when the last reference to the array (or a
    view of it) dies. Pages are placed on first touch, by the kind's policy.
    """
    return _new(shape, dtype, kind, order, zero=False)


def zeros(shape: Any, dtype: Any = float, kind: str = "hbw", *, order: str = "C") -> np.ndarray:
    """Like :func:`empty`, with every byte written to zero, so every page is placed now."""
    return _new(shape, dtype, kind, order, zero=True)


def empty_like(array: np.ndarray, kind: str = "hbw", *, dtype: Any = None) -> np.ndarray:
    """An uninitialised array shaped like ``array`` (C or Fortran order kept)."""
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    return _new(array.shape, array.dtype if dtype is None else dtype, kind, order, zero=False)


def _multiarray() -> ModuleType:
    core = getattr(np, "_core", None) or np.core  # NumPy 2 moved np.core to np._core
    return core.multiarray


def handler_name(array: np.ndarray | None = None) -> str:
    """The NEP-49 memory handler of ``array`` (or the one installed now)."""
    get = _multiarray().get_handler_name
    return get() if array is None else get(array)


@contextmanager
def allocator(kind: str) -> Iterator[str]:
    """Make every NumPy array created inside the block come from memkind ``kind``.

    Installs a NEP-49 handler for the current context (thread or task) and
    restores the previous handler on exit, exceptions included. Yields the kind
    that serves the memory (``dram`` when ``hbw_preferred`` falls back). Arrays keep
    their handler, so ones created inside are freed by memkind after the block.
    """
    served = resolve_kind(kind)
    native = _native()
    previous = native.set_handler(native.handler(served))
    try:
        yield served
    finally:
        native.set_handler(previous)


def kind_of(array: np.ndarray) -> str | None:
    """The memkind kind that serves ``array``'s memory, or None when not from hpcmem.hbw."""
    try:
        native = _native()
    except MemkindNotBuiltError:
        return None
    obj: Any = array
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            name = handler_name(obj)
            return name.removeprefix(HANDLER_PREFIX) if name.startswith(HANDLER_PREFIX) else None
        obj = obj.base
    return obj.kind if isinstance(obj, native.Buffer) else None


def _byte_range(array: np.ndarray) -> tuple[int, int]:
    """Start address and length of the memory ``array`` spans (any strides)."""
    start = end = array.__array_interface__["data"][0]
    for dim, stride in zip(array.shape, array.strides, strict=True):
        reach = (dim - 1) * stride
        start, end = (start + reach, end) if reach < 0 else (start, end + reach)
    return start, end - start + array.itemsize


@dataclass(frozen=True)
class Placement:
    """Where an array's pages are, measured with move_pages(2).

    ``pages`` is every page the array spans, ``nodes`` the touched ones per NUMA
    node, ``untouched`` those not yet backed by memory. ``hbw_fraction`` is the
    share of touched pages on HBW nodes (None without HBW nodes or touched pages).
    ``source`` says how the HBW nodes were found (see :func:`topology.hbw_nodes`).
    ``policies`` counts pages by the memory policy governing them, spelled as in
    /proc/self/numa_maps (``bind:0`` for ``hbw``, ``default``, or what numactl set):
    on an emulated node it is what tells memkind's pages from plain ones.
    """

    pages: int
    nodes: dict[int, int]
    untouched: int
    policies: dict[str, int]
    hbw_nodes: tuple[int, ...]
    hbw_fraction: float | None
    emulated: bool
    source: str
    kind: str | None = field(default=None)

    def to_record(self) -> dict[str, Any]:
        """The ``placement`` object of a result record (JSON-ready)."""
        return {
            "hbw_fraction": self.hbw_fraction,
            "nodes": {str(node): count for node, count in sorted(self.nodes.items())},
            "emulated": self.emulated,
            "hbw_nodes": list(self.hbw_nodes),
            "source": self.source,
            "pages": self.pages,
            "untouched": self.untouched,
            "policies": dict(sorted(self.policies.items())),
            "kind": self.kind,
        }


def placement(array: np.ndarray) -> Placement:
    """The NUMA node of every page of ``array``: any NumPy array, whoever allocated it."""
    native = _native()
    hbw = topology.hbw_nodes()
    start, length = _byte_range(array) if array.size else (0, 0)
    counts = native.page_nodes(start, length) if length else {}
    nodes = {node: n for node, n in counts.items() if node >= 0}
    pages = sum(counts.values())
    touched = sum(nodes.values())
    on_hbw = sum(n for node, n in nodes.items() if node in hbw.nodes)
    return Placement(
        pages=pages,
        nodes=nodes,
        untouched=pages - touched,
        policies=native.page_policies(start, length) if length else {},
        hbw_nodes=hbw.nodes,
        hbw_fraction=on_hbw / touched if hbw.nodes and touched else None,
        emulated=hbw.emulated,
        source=hbw.source,
        kind=kind_of(array),
    )


def verify(array: np.ndarray) -> bool:
    """memkind's own check (``hbw_verify_memory_region``): every page of ``array`` on HBW."""
    native = _native()
    start, length = _byte_range(array)
    code = native.verify_hbw(start, length) if array.size else 0
    if code not in (0, -1):
        raise OSError(code, f"hbw_verify_memory_region of {length} bytes failed")
    return code == 0
