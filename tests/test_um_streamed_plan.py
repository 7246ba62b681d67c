"""How the streamed strategy spends a budget, and the PCIe bound: arithmetic only."""

from __future__ import annotations

import pytest

from hpcmem.um.budget.floor import TARGET_FRACTION, BudgetTooSmallError, check_minimum
from hpcmem.um.budget.transport import InFlight, pcie_transfer_ms
from hpcmem.um.streamed.plan import (
    Probe,
    adjust_keep,
    keep_from,
    out_cap,
    plan_stream,
    segment_bytes,
    spendable,
)

GiB = 2**30
MiB = 2**20
ORDER = ("params", "activations", "inputs")


def _probe(**changes) -> Probe:
    fields = dict(
        peak_bytes=4 * GiB, entry_bytes=[GiB // 4] * 8, state_bytes=[GiB] * 8,
        saved_bytes=2 * GiB, largest_saved=GiB // 2, block_saved_bytes=12 * GiB,
        block_input_bytes=GiB // 2, largest_block_saved=GiB, recomputed=True,
    )
    fields.update(changes)
    return Probe(**fields)


def test_a_budget_at_the_probe_peak_adds_nothing_to_it_and_recomputes():
    plan = plan_stream(int(4 * GiB / TARGET_FRACTION), _probe(), ORDER)
    assert plan.recompute
    assert plan.resident == () and plan.keep_bytes == 0
    assert plan.param_window == 0 and plan.saved_window == 0  # fetched on demand, as probed


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
    assert not plan_stream(5 * GiB, _probe(recomputed=False, block_saved_bytes=0), ORDER).recompute


def test_kept_activations_are_the_last_saved():
    sizes = [4, 3, 2, 1]
    assert keep_from(sizes, 0) == 4
    assert keep_from(sizes, 3) == 2  # the last two (2 + 1)
    assert keep_from(sizes, 5) == 2
    assert keep_from(sizes, 100) == 0


def test_keep_moves_half_way_towards_the_target_and_stays_in_range():
    budget = 10 * GiB
    probe = _probe(rounding_bytes=GiB // 4)
    target = spendable(budget, probe)
    assert target == int(budget * TARGET_FRACTION) - GiB // 4 - GiB // 2  # one 512 MiB segment
    assert adjust_keep(GiB, target - 2 * GiB, 0, budget, 8 * GiB, probe) == 2 * GiB
    assert adjust_keep(GiB, target + 4 * GiB, 0, budget, 8 * GiB, probe) == 0
    assert adjust_keep(7 * GiB, 0, 0, budget, 8 * GiB, probe) == 8 * GiB


def test_keep_never_grows_the_segments_held_past_the_target_less_one_segment():
    budget = 64 * MiB
    probe = _probe(peak_bytes=40 * MiB, allocated_bytes=30 * MiB, entry_bytes=[4 * MiB] * 6,
                   state_bytes=[16 * MiB] * 6, largest_saved=MiB, rounding_bytes=10 * MiB)
    target = int(budget * TARGET_FRACTION)
    # allocated bytes would allow 8 MiB more, but the segments held are within one 20 MiB
    # segment (of a 4 MiB parameter) of the target: nothing more is kept
    assert adjust_keep(2 * MiB, 10 * MiB, target - 20 * MiB, budget, 8 * MiB, probe) == 2 * MiB
    # past it, and grown in this step: keep less; not grown (segments are cached): keep as is
    assert adjust_keep(4 * MiB, 10 * MiB, target, budget, 8 * MiB, probe) < 4 * MiB
    assert adjust_keep(4 * MiB, 10 * MiB, target, budget, 8 * MiB, probe, grew=False) == 4 * MiB


def test_segments_are_those_of_the_caching_allocator():
    assert segment_bytes(512) == segment_bytes(MiB) == 2 * MiB
    assert segment_bytes(MiB + 1) == segment_bytes(10 * MiB - 1) == 20 * MiB
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(11 * MiB + 1) == 12 * MiB


def test_a_small_budget_leaves_the_measured_rounding_and_a_segment_to_the_allocator():
    """64 MiB for six 4 MiB parameters: 20 MiB segments; the probe held 10 MiB more than it
    allocated. What is left after both is too little to keep or prefetch anything."""
    probe = _probe(peak_bytes=40 * MiB, allocated_bytes=30 * MiB, entry_bytes=[4 * MiB] * 6,
                   state_bytes=[16 * MiB] * 6, saved_bytes=6 * MiB, largest_saved=MiB,
                   block_saved_bytes=0, recomputed=False, rounding_bytes=10 * MiB)
    plan = plan_stream(64 * MiB, probe, ORDER)
    assert plan.resident == () and plan.keep_bytes == 0
    assert plan.param_window == 0 and plan.saved_window == 0
    assert plan.chunk_bytes < 2 * 16 * MiB  # one parameter at a time, as in the probe
    roomy = plan_stream(160 * MiB, probe, ORDER)
    assert roomy.keep_bytes + sum(probe.state_bytes[i] for i in roomy.resident) <= (
        spendable(160 * MiB, probe) - 30 * MiB)
    assert roomy.keep_bytes > 0 or roomy.resident


def test_pcie_time_overlaps_the_two_directions_at_the_rate_measured_for_both():
    rates = {"h2d": 50e9, "d2h": 50e9, "both": 40e9}
    assert pcie_transfer_ms(10e9, 0, rates) == pytest.approx(200.0)
    assert pcie_transfer_ms(10e9, 10e9, rates) == pytest.approx(250.0)
    assert pcie_transfer_ms(10e9, 4e9, rates) == pytest.approx(100.0 + 120.0)


class _Copy:
    """A copy out as the host sees it: done once the device got to it (a CUDA event's
    query and synchronize)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.done = log, name, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"waited {self.name}")
        self.done = True


def test_copies_out_in_flight_never_pass_the_cap():
    log: list[str] = []
    flight = InFlight(cap=100)
    copies = [_Copy(log, str(i)) for i in range(4)]
    for copy in copies[:2]:
        flight.make_room(40)
        flight.add(copy, object(), 40)
    assert flight.bytes == 80 and log == []
    flight.make_room(40)  # 120 would pass the cap: the oldest copy is waited for
    assert log == ["waited 0"] and flight.bytes == 40
    flight.add(copies[2], object(), 40)
    copies[1].done = copies[2].done = True  # finished on their own: let go without waiting
    flight.make_room(100)
    assert log == ["waited 0"] and flight.bytes == 0
    flight.add(copies[3], object(), 250)  # larger than the cap: goes alone
    flight.make_room(1)
    assert log == ["waited 0", "waited 3"] and flight.bytes == 0


def test_a_budget_under_the_probe_peak_is_refused_and_one_above_it_is_not():
    with pytest.raises(BudgetTooSmallError, match=r"below the 5368709120 bytes \(5\.00 GiB\)"):
        check_minimum(4 * GiB, 5 * GiB)
    check_minimum(5 * GiB, 5 * GiB)


@pytest.mark.parametrize("budget", [5 * GiB, 6 * GiB, 8 * GiB, 16 * GiB, 24 * GiB])
def test_what_the_plan_adds_to_the_probe_peak_fits_the_target(budget):
    probe = _probe(held_bytes=GiB // 8)
    plan = plan_stream(budget, probe, ORDER)
    target = spendable(budget, probe)
    largest = max(probe.entry_bytes)
    windows = (plan.param_window + largest if plan.param_window else 0) + (
        plan.saved_window + probe.largest_saved if plan.saved_window else 0)
    resident = sum(probe.state_bytes[i] for i in plan.resident)
    if plan.recompute:
        assert probe.peak_bytes + windows + resident + plan.keep_bytes <= max(target,
                                                                              probe.peak_bytes)
    streamed = [b for i, b in enumerate(probe.state_bytes) if i not in plan.resident]
    if streamed:  # the optimizer step: set-up bytes, resident state, two chunks, copies out
        chunk = max(plan.chunk_bytes, max(streamed))  # and one more for temporaries
        optimizer = probe.held_bytes + resident + 3 * chunk + out_cap(budget)
        assert optimizer <= max(target, probe.held_bytes + 3 * max(streamed) + out_cap(budget))


def test_a_parameter_larger_than_a_chunk_steps_one_entry_at_a_time():
    """A tied embedding of 1.5 GiB of state among 200 MiB layers, 2.5 GiB of budget: three
    chunks of the embedding's size cannot fit, so the step goes entry by entry, as the probe
    measured it (chunks as large as the embedding held 3.46 GiB on an H200)."""
    probe = _probe(peak_bytes=GiB, entry_bytes=[384 * MiB] + [50 * MiB] * 10,
                   state_bytes=[1536 * MiB] + [200 * MiB] * 10, saved_bytes=0, largest_saved=0,
                   block_saved_bytes=0, recomputed=False)
    plan = plan_stream(5 * GiB // 2, probe, ORDER)
    assert plan.chunk_bytes == 0
    assert plan_stream(16 * GiB, probe, ORDER).chunk_bytes > 0
