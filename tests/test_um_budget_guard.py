"""GPU budget and oversubscription guard arithmetic (CPU only)."""

from __future__ import annotations

import pytest

from hpcmem.um import (
    ENV_ALLOW,
    check_request,
    default_headroom,
    managed_limit,
    oversubscription_allowed,
)
from hpcmem.um.streamed.plan import plan_budget

GiB = 2**30
ALL_GPU = {"params": True, "activations": True, "inputs": True}
ORDER = ("params", "activations", "inputs")


def test_budget_fills_types_in_priority_order():
    demand = {"params": 6 * GiB, "activations": 8 * GiB, "inputs": 1 * GiB}
    assert plan_budget(10 * GiB, ORDER, demand, ALL_GPU) == {
        "params": 6 * GiB,
        "activations": 4 * GiB,
        "inputs": 0,
    }
    reverse = ("inputs", "activations", "params")
    assert plan_budget(10 * GiB, reverse, demand, ALL_GPU) == {
        "inputs": 1 * GiB,
        "activations": 8 * GiB,
        "params": 1 * GiB,
    }


def test_budget_larger_than_demand_and_types_not_on_the_gpu():
    demand = {"params": 3, "activations": 4, "inputs": 5}
    wants = {"params": True, "activations": True, "inputs": False}
    quotas = plan_budget(100, ORDER, demand, wants)
    assert quotas == {"params": 3, "activations": 4, "inputs": 0}
    assert sum(quotas.values()) <= 100


def test_unknown_demand_takes_what_is_left():
    assert plan_budget(10, ORDER, {"params": 4}, ALL_GPU) == {
        "params": 4,
        "activations": 6,
        "inputs": 0,
    }


@pytest.mark.parametrize("budget", [0, 1, 7, 15, 16, 1000])
def test_budget_never_exceeded(budget):
    demand = {"params": 5, "activations": 7, "inputs": 3}
    quotas = plan_budget(budget, ORDER, demand, ALL_GPU)
    assert sum(quotas.values()) == min(budget, 15)
    assert all(0 <= quotas[t] <= demand[t] for t in ORDER)


def test_budget_rejects_negative_values():
    with pytest.raises(ValueError, match="gpu_budget: -1 bytes must be >= 0"):
        plan_budget(-1, ORDER, {}, ALL_GPU)
    with pytest.raises(ValueError, match="demand of params: -3 bytes"):
        plan_budget(1, ORDER, {"params": -3}, ALL_GPU)


def test_headroom_and_limit():
    assert default_headroom(141 * GiB) == 141 * GiB // 20
    assert default_headroom(8 * GiB) == GiB
    assert managed_limit(100 * GiB, 7 * GiB, allowed=False) == 93 * GiB
    assert managed_limit(GiB, 2 * GiB, allowed=False) == 0
    assert managed_limit(100 * GiB, 7 * GiB, allowed=True) is None
    with pytest.raises(ValueError, match="headroom_bytes: -1"):
        managed_limit(1, -1, allowed=False)


def test_oversubscription_is_allowed_only_explicitly():
    assert not oversubscription_allowed(False, {})
    assert not oversubscription_allowed(False, {ENV_ALLOW: "0"})
    assert oversubscription_allowed(False, {ENV_ALLOW: "1"})
    assert oversubscription_allowed(True, {})
    with pytest.raises(ValueError, match=rf"{ENV_ALLOW}: 'yes' is not one of 0, 1"):
        oversubscription_allowed(False, {ENV_ALLOW: "yes"})


def test_guard_refusal_is_a_torch_out_of_memory_error_that_explains_itself():
    torch = pytest.importorskip("torch")
    from hpcmem.um import OversubscriptionError

    check_request(10, 80, 90)  # exactly at the limit: allowed
    check_request(10**15, 0, None)  # no limit
    with pytest.raises(OversubscriptionError) as error:
        check_request(11, 80, 90)
    assert isinstance(error.value, torch.OutOfMemoryError)
    text = str(error.value)
    assert "refused 11 bytes" in text and "80 bytes are already managed" in text
    assert "limit is 90 bytes" in text and ENV_ALLOW in text
