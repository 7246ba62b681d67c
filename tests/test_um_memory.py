"""UnifiedMemory's one interface: which implementation a policy gets, its errors, the native
ABI (CPU only; the managed implementation runs in tests/test_um_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcmem.errors import HpcmemError
from hpcmem.um import (
    BudgetError,
    MemoryScopes,
    OversubscriptionError,
    PolicyError,
    UnifiedMemory,
    UnifiedMemoryError,
    check_request,
)
from hpcmem.um.memory import budget_bytes
from hpcmem.um.policy import TYPES

torch = pytest.importorskip("torch")


def test_the_cuda_preset_is_the_pass_through_behind_the_same_interface():
    from hpcmem.um.passthrough import PassThroughMemory

    with UnifiedMemory("cuda", device=0) as um:
        assert isinstance(um, PassThroughMemory) and isinstance(um, MemoryScopes)
        assert not um.managed and um.limit_bytes is None and um.segments("params") == []
        if torch.cuda.is_available():
            assert um.stage(torch.ones(3)).device == torch.device("cuda", 0)
        with um.params(), um.activations(), um.inputs():
            pass
        assert um.stats() == {"policy": "cuda", "managed": False, "escaped_bytes": None,
                              **{t: None for t in TYPES}}
    with pytest.raises(UnifiedMemoryError, match="closed"), um.activations():
        pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_a_managed_preset_without_a_gpu_is_a_clear_hpcmem_error():
    with pytest.raises(UnifiedMemoryError, match="needs Unified Memory on a CUDA GPU") as error:
        UnifiedMemory("hpcmem")
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, HpcmemError)


@pytest.mark.parametrize(("policy", "budget", "message"), [
    ("cuda", 2**30, "gpu_budget: needs a managed policy; 'cuda' is PyTorch's allocator"),
    ("cuda", 0, "gpu_budget: 0 bytes must be positive"),
    ("cuda", "24X", r"gpu_budget: '24X' is not a size \(accepted: a number with optional K"),
    ("cuda", "0", "gpu_budget: '0' is not a positive size"),
    ("cuda", 2.5, r"gpu_budget: 2\.5 is not a size \(accepted: bytes as an integer, or "),
    ("cuda", True, "gpu_budget: True is not a size"),
    ("cuda", "8G", "gpu_budget: needs a managed policy"),  # a size is read, then the policy
])
def test_a_budget_the_job_cannot_use_is_refused_before_anything_is_allocated(
    policy, budget, message
):
    with pytest.raises(BudgetError, match=message) as error:
        UnifiedMemory(policy, gpu_budget=budget)
    assert isinstance(error.value, ValueError) and isinstance(error.value, HpcmemError)


def test_a_budget_is_bytes_or_a_size():
    assert budget_bytes(8 << 30) == budget_bytes("8G") == budget_bytes("8GiB") == 8 << 30
    assert budget_bytes("1.5G") == 3 << 29
    assert budget_bytes(np.int64(4096)) == 4096


def test_every_error_of_the_package_is_an_hpcmem_error():
    with pytest.raises(PolicyError) as policy:
        UnifiedMemory("fast")
    assert isinstance(policy.value, HpcmemError)
    with pytest.raises(OversubscriptionError) as refused:
        check_request(2, 1, 2)
    assert isinstance(refused.value, torch.OutOfMemoryError)
    assert isinstance(refused.value, HpcmemError)


def test_the_abi_is_read_from_the_native_module():
    um = pytest.importorskip("hpcmem._um")
    from hpcmem.um.native import Abi

    abi = Abi.of(um)
    assert [abi.type_ids[t] for t in um.TYPE_NAMES] == list(range(len(TYPES)))
    assert sorted(abi.type_ids) == sorted(TYPES)
    assert abi.location_ids == {"gpu": um.LOC_GPU, "cpu": um.LOC_CPU, "none": um.LOC_NONE}
    assert abi.access_bits == {"gpu": um.LOC_GPU, "cpu": um.LOC_CPU}
    assert abi.unlimited == um.UNLIMITED == 2**64 - 1
