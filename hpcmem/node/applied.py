"""The binding actually applied to this process: CPU affinity and NUMA memory policy.

A launcher (numactl, ``srun --cpu-bind``, ``mpirun --bind-to``) sets both before
Python starts; this module reads them back from the kernel so every record says
where a rank really ran, not where it was asked to run. The memory policy comes
from ``get_mempolicy(2)`` through libnuma (ctypes); the numactl arguments a
wrapper used are taken from ``HPCMEM_NUMACTL_ARGS`` and the binding's name from
``HPCMEM_BINDING`` when it sets them, the rank's index on its node from the variable its
launcher sets (:func:`hpcmem.node.launcher.local_rank`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shlex
import socket
from functools import cache
from typing import Any

from hpcmem.node.launcher import RankError, local_rank

__all__ = [
    "BINDING_ENV",
    "MEMPOLICY_MODES",
    "NUMACTL_ENV",
    "binding_label",
    "cpu_affinity",
    "current",
    "mempolicy",
]

#: environment variable through which a binding wrapper reports its numactl arguments
NUMACTL_ENV = "HPCMEM_NUMACTL_ARGS"
#: environment variable through which a binding wrapper reports the binding's name (e.g. ``hbw``)
BINDING_ENV = "HPCMEM_BINDING"

#: MPOL_* values of <linux/mempolicy.h> -> names
MEMPOLICY_MODES: dict[int, str] = {
    0: "default",
    1: "preferred",
    2: "bind",
    3: "interleave",
    4: "local",
    5: "preferred_many",
    6: "weighted_interleave",
}
_MODE_FLAGS_MASK = (1 << 15) | (1 << 14) | (1 << 13)  # MPOL_F_STATIC/RELATIVE_NODES, NUMA_BALANCING
_MAX_NODES = 1024  # bits in the node mask passed to the kernel (>= MAX_NUMNODES)
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8


@cache
def _libnuma() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("numa") or "libnuma.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.get_mempolicy.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_ulong),
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_uint,
    ]
    lib.get_mempolicy.restype = ctypes.c_long
    return lib


def cpu_affinity() -> list[int]:
    """The CPUs this process may run on (``sched_getaffinity``), sorted."""
    return sorted(os.sched_getaffinity(0))


def mempolicy() -> dict[str, Any]:
    """This thread's memory policy: ``{"mode": name, "nodes": [...]}``.

    ``nodes`` is the policy's node mask (empty for ``default`` and ``local``).
    Without libnuma the mode is None and ``error`` says why.
    """
    lib = _libnuma()
    if lib is None:
        return {"mode": None, "nodes": [], "error": "libnuma.so.1 not found (apt install libnuma1)"}
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * (_MAX_NODES // _ULONG_BITS))()
    if lib.get_mempolicy(ctypes.byref(mode), mask, _MAX_NODES, None, 0) != 0:
        errno = ctypes.get_errno()
        return {"mode": None, "nodes": [], "error": f"get_mempolicy: {os.strerror(errno)}"}
    flags = mode.value & _MODE_FLAGS_MASK
    base = mode.value & ~_MODE_FLAGS_MASK
    nodes = [
        word * _ULONG_BITS + bit
        for word, value in enumerate(mask)
        for bit in range(_ULONG_BITS)
        if value >> bit & 1
    ]
    policy: dict[str, Any] = {"mode": MEMPOLICY_MODES.get(base, f"unknown({base})"), "nodes": nodes}
    if flags:
        policy["flags"] = flags
    return policy


def current() -> dict[str, Any]:
    """The binding applied to this process, as recorded in every result record.

    ``host`` is the node it runs on and ``local_rank`` its rank there as the launcher
    says (None when no launcher said, or what it said is not a rank), ``name`` the
    binding's name from ``HPCMEM_BINDING`` and ``numactl`` the arguments from
    ``HPCMEM_NUMACTL_ARGS`` as a list (None when no wrapper reported them), ``cpus`` the
    CPU affinity, ``mempolicy`` the kernel's memory policy.
    """
    raw = os.environ.get(NUMACTL_ENV)
    try:
        local = local_rank()
    except RankError:
        local = None  # a record says what was applied; refusing is the commands' part
    return {
        "host": socket.gethostname(),
        "local_rank": local,
        "name": os.environ.get(BINDING_ENV) or None,
        "numactl": shlex.split(raw) if raw is not None else None,
        "cpus": cpu_affinity(),
        "mempolicy": mempolicy(),
    }


def binding_label(binding: Any) -> str:
    """A short, stable name for a binding as :func:`current` records it: its ``name``, else
    rank 0's numactl arguments, else ``none`` (no wrapper reported any)."""
    if not isinstance(binding, dict):
        return "none"
    if isinstance(binding.get("name"), str) and binding["name"]:
        return binding["name"]
    numactl = binding.get("numactl")
    if isinstance(numactl, list):
        return " ".join(map(str, numactl)) or "none"
    if isinstance(numactl, str):
        return numactl or "none"
    return "none"
