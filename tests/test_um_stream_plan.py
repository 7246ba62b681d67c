"""How the streaming mode spends a budget, and the PCIe bound: arithmetic only."""

from __future__ import annotations

import pytest

from hpcmem.um.stream.plan import (
    TARGET_FRACTION,
    Probe,
    adjust_keep,
    keep_from,
    pcie_transfer_ms,
    plan_stream,
)

GiB = 2**30
ORDER = ("params", "activations", "inputs")


def _probe(**changes) -> Probe:
    fields = dict(
        peak_bytes=4 * GiB, entry_bytes=[GiB // 4] * 8, state_bytes=[GiB] * 8,
        saved_bytes=2 * GiB, largest_saved=GiB // 2, block_saved_bytes=12 * GiB,
        block_input_bytes=GiB // 2, largest_block_saved=GiB, recomputed=True,
    )
    fields.update(changes)
    return Probe(**fields)


def test_a_budget_below_the_probe_keeps_the_least_and_recomputes():
    plan = plan_stream(3 * GiB, _probe(), ORDER)
    assert plan.recompute
    assert plan.resident == () and plan.keep_bytes == 0
    assert plan.param_window == GiB // 4  # one parameter ahead, the least there is
    assert plan.saved_window == GiB // 2


def test_room_goes_to_resident_parameters_first_then_kept_activations():
    plan = plan_stream(16 * GiB, _probe(), ORDER)
    slack = int(16 * GiB * TARGET_FRACTION) - 4 * GiB
    windows = plan.param_window + plan.saved_window
    resident = len(plan.resident) * GiB
    assert plan.recompute and resident > 0
    assert windows + resident + plan.keep_bytes <= slack
    activations_first = plan_stream(16 * GiB, _probe(), ("activations", "params", "inputs"))
    assert activations_first.keep_bytes == 2 * GiB  # every saved activation kept
    assert len(activations_first.resident) < len(plan.resident)


def test_when_everything_fits_nothing_is_recomputed_or_streamed():
    plan = plan_stream(64 * GiB, _probe(), ORDER)
    assert not plan.recompute
    assert len(plan.resident) == 8
    assert plan.keep_bytes >= 2 * GiB + 12 * GiB  # blocks' activations are saved again


def test_a_probe_that_did_not_recompute_never_plans_recomputation():
    assert not plan_stream(3 * GiB, _probe(recomputed=False, block_saved_bytes=0), ORDER).recompute


def test_kept_activations_are_the_last_saved():
    sizes = [4, 3, 2, 1]
    assert keep_from(sizes, 0) == 4
    assert keep_from(sizes, 3) == 2  # the last two (2 + 1)
    assert keep_from(sizes, 5) == 2
    assert keep_from(sizes, 100) == 0


def test_keep_moves_half_way_towards_the_target_and_stays_in_range():
    budget = 10 * GiB
    target = int(budget * TARGET_FRACTION)
    assert adjust_keep(GiB, target - 2 * GiB, budget, 8 * GiB) == 2 * GiB
    assert adjust_keep(GiB, target + 4 * GiB, budget, 8 * GiB) == 0
    assert adjust_keep(7 * GiB, 0, budget, 8 * GiB) == 8 * GiB


def test_pcie_time_overlaps_the_two_directions_at_the_rate_measured_for_both():
    rates = {"h2d": 50e9, "d2h": 50e9, "both": 40e9}
    assert pcie_transfer_ms(10e9, 0, rates) == pytest.approx(200.0)
    assert pcie_transfer_ms(10e9, 10e9, rates) == pytest.approx(250.0)
    assert pcie_transfer_ms(10e9, 4e9, rates) == pytest.approx(100.0 + 120.0)
