"""NumPy arrays in high-bandwidth memory (and other tiers) through UMF or memkind.

Kinds: ``dram`` (the default policy), ``hbw`` (bound to the HBW nodes nearest the
process: an error without an HBW node), ``hbw_preferred`` (HBW, falling back to DRAM with
a warning), ``hbw_interleave`` (pages interleaved over every HBW node) and ``dax_kmem``
(CXL or persistent memory exposed as system RAM). Which backend serves them and on which
nodes: :mod:`hpcmem.hbw.native`.

Examples
--------
>>> from hpcmem import hbw
>>> a = hbw.zeros((1024, 1024), dtype="float32", kind="hbw_preferred")
>>> hbw.placement(a).to_record()["nodes"]          # doctest: +SKIP
{'0': 1024}
>>> with hbw.allocator("hbw_preferred"):           # every array made here
...     b = a + 1                                   # comes from the backend
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

from hpcmem.hbw.native import BackendNotBuiltError, KindUnavailableError, backend, native
from hpcmem.node import topology

__all__ = [
    "HBW_KINDS",
    "KINDS",
    "HBWFallbackWarning",
    "HBWUnavailableError",
    "Placement",
    "allocator",
    "empty",
    "empty_like",
    "handler_name",
    "kind_of",
    "placement",
    "resolve_kind",
    "verify",
    "zeros",
]

KINDS = ("dram", "hbw", "hbw_preferred", "hbw_interleave", "dax_kmem")
HBW_KINDS = ("hbw", "hbw_preferred", "hbw_interleave")
HANDLER_PREFIX = "hpcmem_"  # then the backend and the kind: hpcmem_umf_hbw
DECLARE_HBW = "declare HBW nodes with HPCMEM_HBW_NODES=<nodes>"


class HBWUnavailableError(KindUnavailableError):
    """``hbw`` or ``hbw_interleave`` was asked for and there is no HBW node."""


class HBWFallbackWarning(UserWarning):
    """``hbw_preferred`` found no HBW node and took the memory from DRAM."""


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
    code = native().check_available(kind)
    if code == 0:
        return kind
    if kind == "hbw_preferred":
        warnings.warn(
            "kind 'hbw_preferred': no high-bandwidth NUMA node, the memory comes from DRAM "
            f"({DECLARE_HBW})",
            HBWFallbackWarning,
            stacklevel=_caller_stacklevel(),
        )
        return "dram"
    if kind in HBW_KINDS:
        raise HBWUnavailableError(
            f"kind {kind!r}: no high-bandwidth NUMA node on this machine ({backend().name} "
            f"error {code}); {DECLARE_HBW} (on DRAM nodes results are labelled emulated), "
            "or use kind='hbw_preferred', which falls back to DRAM"
        )
    if kind == "dax_kmem":
        raise KindUnavailableError(
            f"kind 'dax_kmem': no DAX KMEM (CXL or persistent memory as system RAM) NUMA node "
            f"({backend().name} error {code}); declare one with HPCMEM_DAX_KMEM_NODES=<nodes>"
        )
    raise KindUnavailableError(
        f"kind {kind!r}: {backend().name} reports it unavailable (error {code})")


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
        raise ValueError(f"dtype {dt}: arrays of Python objects cannot live in {kind} memory")
    if order not in ("C", "F"):
        raise ValueError(f"order {order!r} is not one of C, F")
    nbytes = math.prod(dims) * dt.itemsize
    served = resolve_kind(kind)
    if nbytes > np.iinfo(np.intp).max:
        raise MemoryError(f"{backend().name} kind {served!r}: cannot allocate {nbytes} bytes")
    buffer = native().Buffer(served, nbytes, zero)
    return np.ndarray(dims, dtype=dt, buffer=buffer, order=order)


def empty(shape: Any, dtype: Any = float, kind: str = "hbw", *, order: str = "C") -> np.ndarray:
    """An uninitialised array whose memory comes from ``kind``.

    The memory is returned to its kind when the last reference to the array (or a
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
    """Make every NumPy array created inside the block come from ``kind``.

    Installs a NEP-49 handler for the current context (thread or task) and
    restores the previous handler on exit, exceptions included. Yields the kind
    that serves the memory (``dram`` when ``hbw_preferred`` falls back). Arrays keep
    their handler, so ones created inside are freed by their kind after the block.
    """
    served = resolve_kind(kind)
    module = native()
    previous = module.set_handler(module.handler(served))
    try:
        yield served
    finally:
        module.set_handler(previous)


def kind_of(array: np.ndarray) -> str | None:
    """The kind that serves ``array``'s memory, or None when not from hpcmem.hbw."""
    try:
        module = native()
    except BackendNotBuiltError:
        return None
    prefix = f"{HANDLER_PREFIX}{backend().name}_"
    obj: Any = array
    while isinstance(obj, np.ndarray):
        if obj.base is None:
            name = handler_name(obj)
            return name.removeprefix(prefix) if name.startswith(prefix) else None
        obj = obj.base
    return obj.kind if isinstance(obj, module.Buffer) else None


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
    on an emulated node it is what tells the backend's pages from plain ones.
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
    module = native()
    hbw = topology.hbw_nodes()
    start, length = _byte_range(array) if array.size else (0, 0)
    counts = module.page_nodes(start, length) if length else {}
    nodes = {node: n for node, n in counts.items() if node >= 0}
    pages = sum(counts.values())
    touched = sum(nodes.values())
    on_hbw = sum(n for node, n in nodes.items() if node in hbw.nodes)
    return Placement(
        pages=pages,
        nodes=nodes,
        untouched=pages - touched,
        policies=module.page_policies(start, length) if length else {},
        hbw_nodes=hbw.nodes,
        hbw_fraction=on_hbw / touched if hbw.nodes and touched else None,
        emulated=hbw.emulated,
        source=hbw.source,
        kind=kind_of(array),
    )


def verify(array: np.ndarray) -> bool:
    """The backend's own check that every page of ``array`` is on an HBW node: memkind's
    ``hbw_verify_memory_region``, or for UMF every page on a node it was bound to as HBW."""
    start, length = _byte_range(array)
    code = native().verify_hbw(start, length) if array.size else 0
    if code not in (0, -1):
        raise OSError(code, f"{backend().name}: HBW check of {length} bytes failed")
    return code == 0
