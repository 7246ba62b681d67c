"""hpcmem._hbw loaded once per process, its placement backend picked and bound to the nodes.

The backend is ``HPCMEM_HBW_BACKEND`` (``umf`` or ``memkind``) when set, else the first one
built in: UMF (Intel's Unified Memory Framework) where the build found it, memkind where
only that was found. It serves every kind on the nodes :mod:`hpcmem.node.topology` finds,
so pages, placement records and bindings agree on what is HBW: ``hbw_interleave`` spreads
over every HBW node, ``hbw`` and ``hbw_preferred`` use those nearest this process's CPUs
(the node of its first allowed CPU), ``dax_kmem`` the DAX KMEM nodes. memkind is handed
the same nodes through ``MEMKIND_HBW_NODES`` and ``MEMKIND_DAX_KMEM_NODES``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from hpcmem.errors import BadInputError, HpcmemError
from hpcmem.node import topology

__all__ = [
    "BACKENDS",
    "BACKEND_VARIABLE",
    "INSTALL_HINT",
    "Backend",
    "BackendNotBuiltError",
    "KindUnavailableError",
    "backend",
    "native",
]

BACKEND_VARIABLE = "HPCMEM_HBW_BACKEND"
#: every backend hpcmem knows, the preferred first
BACKENDS = ("umf", "memkind")
INSTALL_HINT = (
    "install a placement backend and rebuild: `pip install umf` (make setup does) with "
    "apt-get install libnuma-dev libhwloc15, or memkind (Debian 12: apt-get install "
    "libmemkind-dev libnuma-dev), then `make native` or `pip install .`"
)


class KindUnavailableError(HpcmemError, RuntimeError):
    """A memory kind cannot allocate on this machine."""


class BackendNotBuiltError(KindUnavailableError):
    """hpcmem._hbw cannot be loaded (built without UMF and memkind, or the library is gone),
    or ``HPCMEM_HBW_BACKEND`` names a backend it was not built with."""


class BackendChoiceError(BadInputError, ValueError):
    """``HPCMEM_HBW_BACKEND`` is not the name of a backend."""


@dataclass(frozen=True)
class Backend:
    """The placement library serving the kinds in this process, and the nodes it ranks
    highest in bandwidth by itself (UMF's HIGHEST_BANDWIDTH memspace; None: no view)."""

    name: str
    version: str
    highest_bandwidth: tuple[int, ...] | None = None

    def to_record(self) -> dict[str, Any]:
        """The ``hbw_backend`` object of a record."""
        nodes = None if self.highest_bandwidth is None else list(self.highest_bandwidth)
        return {"name": self.name, "version": self.version, "highest_bandwidth": nodes}


def _load() -> ModuleType:
    try:
        from hpcmem import _hbw
    except ImportError as error:
        raise BackendNotBuiltError(
            f"hpcmem._hbw cannot be loaded ({error}): hpcmem was built without UMF and "
            f"memkind, or the library is gone; {INSTALL_HINT}"
        ) from None
    return _hbw


def _chosen(built: tuple[str, ...]) -> str:
    asked = os.environ.get(BACKEND_VARIABLE, "").strip()
    if not asked:
        return built[0]
    if asked not in BACKENDS:
        raise BackendChoiceError(
            f"{BACKEND_VARIABLE}={asked!r} is not one of {', '.join(BACKENDS)}")
    if asked not in built:
        raise BackendNotBuiltError(
            f"{BACKEND_VARIABLE}={asked}: hpcmem._hbw was built with {', '.join(built)} only; "
            f"{INSTALL_HINT}")
    return asked


def _local_hbw(hbw: tuple[int, ...], nodes: list[topology.NumaNode]) -> tuple[int, ...]:
    """The HBW nodes nearest the node of this process's first allowed CPU."""
    first_cpu = min(os.sched_getaffinity(0))
    home = next((n for n in nodes if first_cpu in n.cpus), None)
    return hbw if home is None or not hbw else topology.nearest(home, hbw)


@cache
def native() -> ModuleType:
    """hpcmem._hbw with its backend configured (raises :class:`BackendNotBuiltError`)."""
    module = _load()
    name = _chosen(tuple(module.BACKENDS))
    hbw = topology.hbw_nodes().nodes
    dax_kmem, _ = topology.dax_kmem_nodes()
    module.configure(name, list(hbw), list(_local_hbw(hbw, topology.numa_nodes())),
                     list(dax_kmem))
    return module


@cache
def backend() -> Backend:
    """The backend serving the kinds here, fixed for the process:
    ``Backend('umf', '1.2.0', (2, 3))`` on a Xeon Max in flat SNC-2 mode."""
    module = native()
    nodes = module.highest_bandwidth_nodes()
    return Backend(*module.backend(), None if nodes is None else tuple(nodes))
