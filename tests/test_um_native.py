"""The native allocator without a GPU: exports, guard refusals, rollback, errors (CPU only).

The guard is checked before any CUDA call, so its refusals are testable on any machine; on a
machine without a CUDA driver, cudaMallocManaged itself fails and the counters must roll back.
"""

from __future__ import annotations

import ctypes

import pytest

_um = pytest.importorskip(
    "hpcmem._um", reason="hpcmem._um not built (nvcc missing when hpcmem was installed)"
)

TYPES = ("params", "activations", "inputs")


def _cuda_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture
def lib():
    """libhpcmem_um through ctypes (the way CUDAPluggableAllocator loads it), limit restored."""
    library = ctypes.CDLL(_um.library_path())
    for name in TYPES:
        getattr(library, f"hpcmem_um_malloc_{name}").restype = ctypes.c_void_p
        getattr(library, f"hpcmem_um_malloc_{name}").argtypes = [
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        getattr(library, f"hpcmem_um_free_{name}").argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
    library.hpcmem_um_last_error.restype = ctypes.c_char_p
    _um.reset_counters()
    yield library
    _um.set_limit(_um.UNLIMITED)
    _um.reset_counters()


def test_library_exports_a_malloc_free_pair_per_type(lib):
    for name in TYPES:
        assert getattr(lib, f"hpcmem_um_malloc_{name}")
        assert getattr(lib, f"hpcmem_um_free_{name}")
    assert _um.library_path().endswith("libhpcmem_um.so")


@pytest.mark.parametrize(("index", "name"), list(enumerate(TYPES)))
def test_guard_refuses_before_allocating(lib, index, name):
    _um.set_limit(1 << 20)
    assert _um.limit() == 1 << 20
    assert getattr(lib, f"hpcmem_um_malloc_{name}")(2 << 20, 0, None) is None
    counters = _um.counters(index)
    assert counters["refusals"] == 1
    assert counters["last_refused_bytes"] == 2 << 20
    assert counters["live_bytes"] == counters["segments"] == counters["advice_calls"] == 0
    assert _um.managed_bytes() == 0
    message = lib.hpcmem_um_last_error().decode()
    assert f"refused 2097152 bytes of managed memory for {name}" in message
    assert "limit is 1048576 bytes" in message


def test_zero_bytes_is_refused_without_counting(lib):
    assert lib.hpcmem_um_malloc_params(0, 0, None) is None
    assert "0-byte" in lib.hpcmem_um_last_error().decode()
    assert _um.counters(0)["refusals"] == 0


def test_free_of_null_is_a_no_op(lib):
    lib.hpcmem_um_free_inputs(None, 0, 0, None)
    assert _um.counters(2)["segments"] == 0


@pytest.mark.skipif(_cuda_usable(), reason="needs a machine without a usable CUDA driver")
def test_failed_cuda_allocation_rolls_back_and_names_the_bytes(lib):
    assert lib.hpcmem_um_malloc_activations(3 << 20, 0, None) is None
    message = lib.hpcmem_um_last_error().decode()
    assert "cudaMallocManaged(3145728 bytes) for activations failed" in message
    counters = _um.counters(1)
    assert counters["live_bytes"] == counters["peak_bytes"] == counters["segments"] == 0
    assert _um.managed_bytes() == 0


def test_bad_type_and_bad_policy_are_clear_errors():
    with pytest.raises(RuntimeError, match=r"type 7 is not one of 0 \(params\)"):
        _um.set_policy(7, _um.LOC_GPU, 0, False, False)
    with pytest.raises(RuntimeError, match="bad policy for inputs: preferred 9"):
        _um.set_policy(2, 9, 0, False, False)
    with pytest.raises(RuntimeError, match="type -1 is not one of"):
        _um.counters(-1)


def test_policy_round_trips_through_the_library():
    before = _um.get_policy(0)
    try:
        _um.set_policy(0, _um.LOC_CPU, _um.LOC_GPU | _um.LOC_CPU, True, True)
        assert _um.get_policy(0) == (_um.LOC_CPU, 3, True, True)
    finally:
        _um.set_policy(0, *before)


@pytest.mark.skipif(_cuda_usable(), reason="needs a CPU-only torch or no GPU")
def test_managed_policy_without_cuda_is_a_clear_runtime_error():
    pytest.importorskip("torch")
    from hpcmem.um import UnifiedMemory

    with pytest.raises(RuntimeError, match=r"policy 'hpcmem' needs Unified Memory on a CUDA GPU"):
        UnifiedMemory("hpcmem")
    with UnifiedMemory("cuda") as um:  # the pass-through needs no CUDA until used
        with um.params(), um.activations(), um.inputs():
            pass
        assert um.stats()["managed"] is False
