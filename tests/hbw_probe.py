"""Scenarios for tests/test_hbw.py, each run in a fresh interpreter.

The backend is configured once per process from HPCMEM_HBW_BACKEND and the node variables
(memkind itself reads MEMKIND_HBW_NODES once, when it starts), so every environment gets its
own process: ``python hbw_probe.py SCENARIO ARGS`` prints one JSON object on its last line.
With HPCMEM_HBW_EXTENSION set, that built hpcmem._hbw (a one-backend variant) is loaded
instead of the installed one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import warnings
from typing import Any

import numpy as np


def load_extension(path: str) -> None:
    """Make ``path`` (a built _hbw shared object) the module ``hpcmem._hbw``."""
    spec = importlib.util.spec_from_file_location("hpcmem._hbw", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["hpcmem._hbw"] = module

MiB = 1 << 20


def mempolicy(address: int) -> str:
    """The kernel's memory policy of the mapping holding ``address`` (/proc/self/numa_maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                break
        else:
            raise LookupError(f"address {address:#x} is not mapped")
    with open("/proc/self/numa_maps") as numa_maps:
        for line in numa_maps:
            start, policy = line.split()[:2]
            if int(start, 16) == low:
                return policy
    raise LookupError(f"mapping {low:#x} missing from numa_maps")


def pages_spanned(array: np.ndarray) -> int:
    """Pages the array's bytes span, computed from its address alone."""
    from hpcmem import _hbw

    size = _hbw.page_size()
    start = array.ctypes.data
    return (start % size + array.nbytes + size - 1) // size


def rss_bytes() -> int:
    """Resident set size from /proc/self/statm."""
    from hpcmem import _hbw

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _hbw.page_size()


def error_of(call) -> dict[str, str] | None:
    """The class and message of the exception ``call()`` raises, or None."""
    try:
        call()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error), "mro": _mro(error)}
    return None


def _mro(error: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(error).__mro__]


def placement(*kinds: str) -> dict[str, Any]:
    """Placement, the backend's verification and the kernel policy of a written array per kind."""
    from hpcmem import _hbw, hbw

    out: dict[str, Any] = {"backend": hbw.backend().to_record(), "built": list(_hbw.BACKENDS)}
    for kind in kinds:
        array = hbw.empty(4 * MiB + 3, np.uint8, kind=kind)
        untouched = hbw.placement(array).untouched
        array[:] = 7
        out[kind] = {
            "record": hbw.placement(array).to_record(),
            "untouched_before_write": untouched,
            "expected_pages": pages_spanned(array),
            "verify": hbw.verify(array),
            "policy": mempolicy(array.ctypes.data),
            "kind_of": hbw.kind_of(array[1:]),
            "plain_policies": hbw.placement(np.ones(MiB)).policies,
        }
    return out


def unavailable() -> dict[str, Any]:
    """What every kind does on a machine without HBW or DAX KMEM nodes."""
    from hpcmem import hbw

    out: dict[str, Any] = {
        kind: error_of(lambda kind=kind: hbw.empty(16, kind=kind))
        for kind in ("hbw", "hbw_interleave", "dax_kmem")
    }
    before = hbw.handler_name()
    out["allocator_hbw"] = error_of(lambda: hbw.allocator("hbw").__enter__())
    out["handler_unchanged"] = hbw.handler_name() == before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        array = hbw.zeros(MiB, kind="hbw_preferred")
        with hbw.allocator("hbw_preferred") as served:
            scoped = np.ones(1000)
    out["hbw_preferred"] = {
        "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
        "record": hbw.placement(array).to_record(),
        "served_in_scope": served,
        "scoped_handler": hbw.handler_name(scoped),
        "policy": mempolicy(array.ctypes.data),
    }
    return out


def constructors(kind: str) -> dict[str, Any]:
    """zeros, empty and empty_like of one kind: shape, dtype, order, contents, owner."""
    from hpcmem import _hbw, hbw

    zeros = hbw.zeros((3, 5), np.int32, kind=kind)
    empty = hbw.empty(7, "complex128", kind=kind, order="F")
    like = hbw.empty_like(np.ones((4, 6), dtype=np.float32, order="F"), kind=kind)
    empty[:] = np.arange(7) * 1j
    like[...] = 2.5
    checks = {
        "zeros": zeros.shape == (3, 5) and zeros.dtype == np.int32 and not zeros.any(),
        "empty": empty.shape == (7,) and bool(empty[3] == 3j),
        "empty_like": like.shape == (4, 6)
        and like.dtype == np.float32
        and like.flags.f_contiguous
        and float(like.sum()) == 60.0,
        "writeable": all(a.flags.writeable for a in (zeros, empty, like)),
        "owner": all(isinstance(a.base, _hbw.Buffer) for a in (zeros, empty, like)),
        "kind_of": [hbw.kind_of(a) for a in (zeros, empty, like)],
        "aligned": all(a.ctypes.data % 64 == 0 for a in (zeros, empty, like)),
    }
    zero_size = [
        hbw.empty(0, kind=kind),
        hbw.zeros((0, 3), kind=kind),
        hbw.empty_like(np.empty((2, 0)), kind=kind),
    ]
    checks["zero_size"] = [(a.shape, hbw.placement(a).pages) for a in zero_size]
    return checks


def scope() -> dict[str, Any]:
    """Nested allocator() scopes, restore after an exception, other threads unaffected."""
    from hpcmem import hbw

    names: dict[str, Any] = {"default": hbw.handler_name()}
    with hbw.allocator("dram"):
        outer = np.ones(MiB)
        with hbw.allocator("hbw"):
            inner = np.ones(MiB)  # 8 MiB: its own mapping, so its policy is its own
            names["inner_scope"] = hbw.handler_name()
            thread_name: list[str] = []
            worker = threading.Thread(target=lambda: thread_name.append(hbw.handler_name()))
            worker.start()
            worker.join()
            names["other_thread"] = thread_name[0]
        names["after_inner"] = hbw.handler_name()
        after_inner = np.ones(10)
    names["after_outer"] = hbw.handler_name()
    try:
        with hbw.allocator("hbw_interleave"):
            raise KeyError("boom")
    except KeyError:
        names["after_exception"] = hbw.handler_name()
    names["arrays"] = {
        "outer": [hbw.handler_name(outer), hbw.kind_of(outer), mempolicy(outer.ctypes.data)],
        "inner": [hbw.handler_name(inner), hbw.kind_of(inner), mempolicy(inner.ctypes.data)],
        "after_inner": hbw.handler_name(after_inner),
        "plain": hbw.handler_name(np.ones(10)),
        "inner_placement": hbw.placement(inner).to_record(),
    }
    del inner, outer  # freed by their kinds through their handlers, after the scopes ended
    return names


def cycles(kind: str, count: str) -> dict[str, int]:
    """RSS before and after ``count`` allocate/free cycles (buffers and NEP-49 arrays)."""
    from hpcmem import hbw

    def cycle() -> None:
        array = hbw.zeros(64 * 1024, np.uint8, kind=kind)
        array[::4096] = 1
        hbw.empty(0, kind=kind)
        with hbw.allocator(kind):
            np.ones(8192).sum()

    for _ in range(1000):
        cycle()
    before = rss_bytes()
    for _ in range(int(count)):
        cycle()
    return {"before": before, "after": rss_bytes()}


def not_built() -> dict[str, Any]:
    """Every entry point when hpcmem._hbw cannot be imported (a build without a backend)."""
    sys.modules["hpcmem._hbw"] = None  # what `import` sees when the module was never built
    from hpcmem import hbw

    calls = {
        "empty": lambda: hbw.empty(4, kind="dram"),
        "zeros": lambda: hbw.zeros(4, kind="hbw"),
        "allocator": lambda: hbw.allocator("dram").__enter__(),
        "placement": lambda: hbw.placement(np.ones(4)),
        "backend": hbw.backend,
    }
    out: dict[str, Any] = {name: error_of(call) for name, call in calls.items()}
    out["kind_of"] = hbw.kind_of(np.ones(4))
    out["unknown_kind"] = error_of(lambda: hbw.empty(4, kind="mcdram"))
    return out


def backend_choice() -> dict[str, Any]:
    """What picking the backend (HPCMEM_HBW_BACKEND) gives: the backend or the error."""
    from hpcmem import hbw

    error = error_of(hbw.backend)
    return {"error": error} if error else {"backend": hbw.backend().to_record()}


def mpi_alloc() -> dict[str, Any]:
    """Placement of an array over MPI.Alloc_mem memory."""
    from mpi4py import MPI

    from hpcmem import hbw

    memory = MPI.Alloc_mem(MiB)
    array = np.frombuffer(memory, dtype=np.uint8)
    array[:] = 1
    record = hbw.placement(array).to_record()
    expected = pages_spanned(array)
    del array
    MPI.Free_mem(memory)
    return {"record": record, "expected_pages": expected}


SCENARIOS = {
    f.__name__: f
    for f in (placement, unavailable, constructors, scope, cycles, not_built, backend_choice,
              mpi_alloc)
}

if __name__ == "__main__":
    if extension := os.environ.get("HPCMEM_HBW_EXTENSION"):
        load_extension(extension)
    print(json.dumps(SCENARIOS[sys.argv[1]](*sys.argv[2:])))
