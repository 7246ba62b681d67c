"""A batch split into parts inside a causal LM's forward (hpcmem.um.budget.batch_split), on the
CPU transport: the same losses and weights as the whole batch's, through the loop's own
scaling and accumulation; the plan's rows from measured bytes; and the floor's refusal
naming what makes it up.

Tolerances: fp32, the parts' losses and gradients summed in another order than the whole
batch's, so losses within 1e-6 relative, and weights within 1e-5 absolute after three AdamW
steps of lr 1e-3 (1% of one step: Adam divides a gradient near zero by its own size, so a
last-bit difference there moves its update most).
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cpu_memory import CpuMemory  # noqa: E402
from um_functions import tiny_qwen2  # noqa: E402

from hpcmem.um import BudgetError  # noqa: E402
from hpcmem.um.budget import HostOptimizerOffload  # noqa: E402
from hpcmem.um.budget.batch_split import BatchSplit, Measure  # noqa: E402
from hpcmem.um.budget.floor import BudgetTooSmallError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 2**30
STEPS = 3
ROWS, TOKENS = 5, 24
LOSS_SCALE = 0.25


def _batches(vocab: int, micro: int):
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        step = []
        for _ in range(micro):
            tokens = torch.randint(vocab, (ROWS, TOKENS), generator=generator)
            labels = tokens.clone()
            labels[1, :7] = -100  # rows of unequal target counts: the parts' divisor matters
            step.append((tokens, labels, torch.ones_like(tokens)))
        out.append(step)
    return out


def _train(offload: HostOptimizerOffload, micro: int = 1):
    """Losses and final weights of STEPS steps of ``micro`` loop micro-batches each (the
    loop scales each loss by its share, as HF Trainer does, and by ``LOSS_SCALE``, as a loss
    scaler would), and the split's record."""
    model = tiny_qwen2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, optimizer, offload=offload)
        for step in _batches(model.config.vocab_size, micro):
            total = 0.0
            for tokens, labels, mask in step:
                with memory.activations():
                    loss = model(input_ids=tokens, attention_mask=mask, labels=labels).loss
                    (loss * LOSS_SCALE / micro).backward()
                total += loss.item() / micro
            optimizer.step()
            optimizer.zero_grad()
            losses.append(total)
        stats = memory.stats()["offload"]
        record = {**stats["chunked_loss"]["batch_split"],
                  "micro_batch_sums": stats["micro_batch_sums"]}
    return losses, [p.detach().clone() for p in model.parameters()], record


@pytest.mark.parametrize(("rows", "micro", "host"), [
    (1, 1, False), (2, 1, False), (1, 2, False), (2, 2, False),
    (1, 1, True), (2, 1, True),  # the parts' gradients summed in host memory
])
def test_a_split_batch_trains_as_the_whole_one(rows: int, micro: int, host: bool):
    whole, whole_weights, record = _train(HostOptimizerOffload(batch_split=False,
                                                               micro_batches=micro), micro)
    assert record["parts"] == 1 and record["enabled"] is False
    split, split_weights, record = _train(HostOptimizerOffload(
        batch_split=rows, micro_batches=micro, host_accumulation=host or None), micro)
    assert record["parts"] == -(-ROWS // rows) and record["exact"] is True
    assert record["sums"] == ("host" if host else "device")
    assert split == pytest.approx(whole, rel=1e-6)
    for a, b in zip(split_weights, whole_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [False, 2])
def test_micro_batches_summed_in_host_memory_train_as_on_the_device(rows):
    """Earlier micro-batches' gradients leave as they land and the CPU adds them up; a split
    batch's parts then sum on the device (one sum at a time in host memory)."""
    device, device_weights, record = _train(HostOptimizerOffload(
        batch_split=rows, micro_batches=2, host_accumulation=False), 2)
    assert record["micro_batch_sums"] == "device"
    host, host_weights, record = _train(HostOptimizerOffload(
        batch_split=rows, micro_batches=2, host_accumulation=True), 2)
    assert record["micro_batch_sums"] == "host"
    assert record["sums"] == ("device" if rows else None)
    assert record["parts"] == (3 if rows else 1)
    assert host == pytest.approx(device, rel=1e-6)
    for a, b in zip(host_weights, device_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_the_measuring_row_leaves_the_training_as_it_was():
    """The first forward measures a row, forward and backward, its gradients dropped: the
    steps train as without it (the CPU transport counts no activations, so every batch then
    runs whole)."""
    losses, weights, record = _train(HostOptimizerOffload())
    whole, whole_weights, _ = _train(HostOptimizerOffload(batch_split=False))
    assert losses == whole
    for a, b in zip(weights, whole_weights, strict=True):
        assert torch.equal(a, b)
    assert record["token_bytes"] == 1 and record["parts"] == 1  # nothing counted on the CPU
    assert record["floor_bytes"] is not None


class _HostSums:
    """Where a strategy that can sum the parts in host memory says it does."""

    def __init__(self, always: bool = False) -> None:
        self.always = always


def _split(room: int, grads: int, peak: list[int] | None = None,
           host: _HostSums | None = None) -> BatchSplit:
    """A split planning with these figures (nothing held; ``peak[0]`` the peak)."""
    peak = peak if peak is not None else [0]
    split = BatchSplit()
    split.bind(Measure(live_bytes=lambda: 0, peak_bytes=lambda: peak[0],
                       reset_peak=lambda: None, room=lambda: room, grad_bytes=grads,
                       host_sums=host))
    return split


def _no_dry_run(count: int) -> None:
    raise AssertionError(f"measured already: no row runs again ({count} asked)")


@pytest.mark.parametrize(("room", "expected"), [
    (8 * 1024 * 100, None),  # the whole batch's 8 rows fit: not split
    (8 * 1024 * 100 - 1, 2),  # beside a gradient set of 5 rows' bytes, two rows fit
    (7 * 1024 * 100 - 1, 1),
    (6 * 1024 * 100 - 1, 1),  # not even one row beside the gradients: one row, the floor
])
def test_the_plan_splits_only_where_the_whole_batch_does_not_fit(room: int, expected):
    split = _split(room, grads=5 * 1024 * 100)
    split.token_bytes = 100
    assert split.plan(8, 1024, _no_dry_run) == expected


@pytest.mark.parametrize(("room", "always", "expected", "host"), [
    (8 * 1024 * 100, False, None, False),  # the whole batch fits
    (8 * 1024 * 100 - 1, False, 2, False),  # two rows fit beside the gradient set
    (6 * 1024 * 100 - 1, False, 5, True),  # none does: five without it, summed on the host
    (8 * 1024 * 100 - 1, True, 7, True),  # always on the host: seven rows a part
])
def test_where_no_row_fits_beside_the_gradients_the_parts_sum_on_the_host(
        room: int, always: bool, expected, host: bool):
    split = _split(room, grads=5 * 1024 * 100, host=_HostSums(always))
    split.token_bytes = 100
    assert split.plan(8, 1024, _no_dry_run) == expected
    assert split.host_summed is host


def test_the_first_plan_measures_rows_doubling_while_twice_them_fit():
    peak, counts = [0], []

    def dry_run(count):  # 100 bytes a token beside 4096 a forward holds whatever its rows
        assert split.dropping
        counts.append(count)
        peak[0] = count * 1024 * 100 + 4096

    split = _split(room=8 * 1024 * 100 + 4096 - 1, grads=2 * 1024 * 100, peak=peak)
    assert split.plan(8, 1024, dry_run) == 5  # not all 8 rows: 5 beside the gradient set
    assert counts == [1, 2, 4] and not split.dropping  # 8 rows might not fit: not measured
    assert (split.token_bytes, split.fixed_bytes) == (100, 4096)
    assert split.floor_bytes == 1024 * 100 + 4096 + 2 * 1024 * 100  # a row and the gradients
    assert split.floor_split
    assert split.plan(8, 512, _no_dry_run) is None  # half the tokens a row: the batch fits


def test_the_gpus_share_of_the_optimizer_leaves_a_whole_batch_its_room():
    from hpcmem.um.host_optimizer.device_step import share_room

    live, peak = [1000], [0]

    def dry_run(count):  # 100 bytes a token beside 4096 a forward holds whatever its rows
        peak[0] = live[0] + count * 1024 * 100 + 4096

    split = BatchSplit()
    split.bind(Measure(live_bytes=lambda: live[0], peak_bytes=lambda: peak[0],
                       reset_peak=lambda: None, room=lambda: 2**24, grad_bytes=2 * 1024 * 100))
    assert split.plan(8, 1024, dry_run) is None  # the batch runs whole
    room = share_room(2**26, held=2**20, batch_split=split)
    assert room == 2**24 - (1000 + 8 * 1024 * 100 + 4096)  # not the budget's 0.96 x 64 MiB
    live[0] += room  # the share takes all of it: later batches still run whole
    assert split.plan(8, 1024, _no_dry_run) is None
    live[0] += 1
    assert split.plan(8, 1024, _no_dry_run) == 5  # a byte more would split them
    assert share_room(2**26, held=2**20, batch_split=None) == int(0.96 * 2**26) - 2**20


def test_a_fixed_peak_at_few_rows_does_not_hide_a_rows_activations():
    row, fixed = 100 * 1024, 600_000  # a loss chunk's bytes set the peak up to 5 rows
    room, peak, peaks = 12 * row, [0], []

    def dry_run(count):
        peak[0] = max(fixed, count * row)
        peaks.append(peak[0])

    split = _split(room=room, grads=0, peak=peak)
    assert split.plan(32, 1024, dry_run) == 12  # 12 rows' activations, the room's
    assert len(peaks) == 4 and max(peaks) <= room  # 1, 2, 4 and 8 rows: none past the room
    assert split.bytes_for(12 * 1024) == 12 * row  # past 8 rows: their bytes scaled


def test_set_rows_are_kept_and_one_row_or_none_runs_whole():
    split = _split(room=10**12, grads=0)
    assert split.plan(1, 1024, _no_dry_run) is None  # one row cannot be split
    fixed = BatchSplit(rows=3)
    fixed.bind(split.measure)
    assert fixed.plan(8, 1024, _no_dry_run) == 3 and fixed.plan(3, 1024, _no_dry_run) is None
    off = BatchSplit(enabled=False)
    off.bind(split.measure)
    assert off.plan(8, 1024, _no_dry_run) is None


@pytest.mark.parametrize("value", [0, -2, 1.5, "auto"])
def test_a_bad_batch_split_is_refused_naming_it(value):
    with pytest.raises(BudgetError, match=f"offload batch_split: {value!r} is not true, false"):
        HostOptimizerOffload(batch_split=value)


def test_sums_in_host_memory_that_cannot_apply_are_refused_naming_why():
    with pytest.raises(BudgetError, match="offload host_accumulation: True sums earlier "
                       "micro-batches or a split batch's parts, which micro_batches=1 and "
                       "batch_split=False rule out"):
        HostOptimizerOffload(host_accumulation=True, batch_split=False)
    with pytest.raises(BudgetError, match=r"offload gpu_share: 0\.5 cannot go with "
                       "host_accumulation=True and micro_batches=4"):
        HostOptimizerOffload(host_accumulation=True, micro_batches=4, gpu_share=0.5)
    HostOptimizerOffload(host_accumulation=True, micro_batches=4, batch_split=False)


def test_a_budget_below_the_floor_names_the_largest_block_and_what_is_off_the_device():
    model = tiny_qwen2()
    working = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = torch.randint(512, (ROWS, TOKENS))
    with CpuMemory(gpu_budget=working // 2) as memory:
        memory.attach(model, torch.optim.AdamW(model.parameters()),
                      offload=HostOptimizerOffload())
        with pytest.raises(BudgetTooSmallError) as caught, memory.activations():
            model(input_ids=tokens, labels=tokens).loss.backward()
    said = str(caught.value)
    assert caught.value.minimum >= working
    assert "working weights" in said and "bytes a token" in said
    assert "the largest block model.layers." in said and "(Qwen2DecoderLayer)" in said
    assert "already off the device: fp32 masters and optimizer state" in said
    assert "2 blocks recomputed" in said


def test_recompute_keeps_the_last_blocks_whose_saved_bytes_the_room_holds():
    from hpcmem.um.budget.recompute import Recompute, repeated_blocks

    model = tiny_qwen2()
    blocks = repeated_blocks(model)
    recompute = Recompute(blocks, live_bytes=lambda: 0)
    recompute.enable()
    # two parts of a batch, each recomputing the last block first: 30 + 50 and 20 + 40 bytes
    recompute.saved_bytes = [30, 20, 50, 40]
    assert recompute.keep_within(79) == 0 and recompute.recomputed == 2
    assert recompute.keep_within(80) == 80 and recompute.recomputed == 1
    assert "forward" not in blocks[-1].__dict__ and "forward" in blocks[0].__dict__
    recompute.saved_bytes = [30, 20, 50, 40]
    assert recompute.keep_within(140) == 140 and not recompute.enabled
    assert all("forward" not in b.__dict__ for b in blocks)


def test_rows_the_split_measured_first_do_not_count_as_the_batchs_saved_bytes():
    """In the probe the split runs 1, 2, 4 and 8 rows forward and backward before the batch:
    each recomputes every block. Only the batch's own parts say what a kept block holds."""
    from hpcmem.um.budget.recompute import Recompute, repeated_blocks

    blocks = repeated_blocks(tiny_qwen2())
    recompute = Recompute(blocks, live_bytes=lambda: 0)
    recompute.enable()
    measured = [10, 10, 20, 20, 40, 40]  # the rows measured (1, 2 and 4 of them here)
    recompute.saved_bytes = [*measured, 80, 80]  # then the batch, whole
    assert recompute.keep_within(159, passes=1) == 80 and recompute.recomputed == 1
    recompute.enable()
    recompute.saved_bytes = [*measured, 80, 80]
    assert recompute.keep_within(159) == 150  # all passes: the last block's 150, not its 80


def test_parameters_with_gradients_in_some_parts_only_sum_over_those():
    """Summed in host memory: a parameter given a gradient in some parts only sums those
    (the others count as zero), times the loop's scale for the earlier parts; one given none
    is stepped as missing."""
    from hpcmem.um.budget import CpuTransport
    from hpcmem.um.host_optimizer import HostOptimizer

    model = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False),
                                torch.nn.Linear(3, 3, bias=False))
    engine = HostOptimizer(model, torch.optim.AdamW(model.parameters()),
                           transport=CpuTransport(), budget=BUDGET,
                           offload=HostOptimizerOffload(), device_scope=nullcontext)
    sums, (bucket,) = engine.part_sums, engine.buckets
    grads = [torch.full((3, 3), value) for value in (1.0, 2.0, 4.0, 8.0)]
    try:
        sums.begin()
        sums.send(0, 0, grads[0])  # part 1: the first position only
        sums.part_done()
        sums.send(0, 0, grads[1])  # part 2: the first again
        sums.part_done()
        sums.scale(torch.tensor(0.5))  # the last part: the second position only
        sums.send(0, 1, grads[3])
        assert sums.holds(0, 0) and not sums.holds(0, 1)
        sums.finish(0)
        sums.end_step()
        home = engine.host.grads[0][0]
        assert torch.equal(bucket.slot(home, 0), torch.full((3, 3), 0.5 * (1.0 + 2.0)))
        assert torch.equal(bucket.slot(home, 1), grads[3])
        assert not sums.active and not sums.holds(0, 0)
    finally:
        engine.close()


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _keep_two_of_three(recompute, middle: int = 120) -> list:
    """``recompute``'s three blocks recomputed, then the last two kept: the last saves 70
    bytes, the one before it ``middle``; the blocks."""
    recompute.enable()
    recompute.saved_bytes = [70, middle, 500]  # backward: the last block first
    assert recompute.keep_within(70 + middle) == 70 + middle and recompute.kept == 2
    return recompute.blocks


def test_kept_blocks_are_recomputed_again_earliest_first_or_not_at_all():
    from hpcmem.um.budget.recompute import Recompute

    recompute = Recompute([_Block() for _ in range(3)], live_bytes=lambda: 0)
    blocks = _keep_two_of_three(recompute)
    assert recompute.take_back(121, most=1) == (0, 0)  # one block frees 120: nothing changes
    assert recompute.recomputed == 1 and recompute.kept == 2
    assert recompute.take_back(100, most=2) == (1, 120)  # the earlier kept block alone
    assert "forward" in blocks[1].__dict__ and "forward" not in blocks[2].__dict__
    assert recompute.recomputed == 2 and recompute.kept == 1 and recompute.enabled
    recompute.saved_bytes = [70, 120, 500]
    recompute.keep_within(10**6)  # all kept: recomputation off
    assert not recompute.enabled and recompute.take_back(1, most=3) == (1, 500)
    assert recompute.enabled and "forward" in blocks[0].__dict__


def test_the_gpus_share_takes_a_kept_blocks_room_where_its_slots_lack_it():
    """The CPU optimizer outlasts backward, but the room left beside the kept activations
    holds no bucket's two slots: the earliest kept block is recomputed again for them,
    where its forward costs less than half the CPU time over the window."""
    from functools import partial

    from hpcmem.um.budget import CpuTransport
    from hpcmem.um.host_optimizer import HostOptimizer
    from hpcmem.um.host_optimizer.device_step import _slots_from_kept_blocks
    from hpcmem.um.host_optimizer.ledger import StepTimes
    from hpcmem.um.host_optimizer.split import SLOTS, plan_split, slot_bytes

    model = torch.nn.Sequential(*(_Block() for _ in range(3)))
    optimizer = torch.optim.AdamW(model.parameters())
    engine = HostOptimizer(model, optimizer, transport=CpuTransport(), budget=BUDGET,
                           offload=HostOptimizerOffload(), device_scope=nullcontext)
    try:
        with engine.scope():  # one step makes Adam's two states
            model(torch.randn(4, 64)).sum().backward()
        optimizer.step()
        assert engine.host.state_count() == 2
        numels = [b.numel for b in engine.buckets]
        slot = slot_bytes(max(numels), engine.host.state_count())
        room = slot - 100  # not one slot: no bucket kept, none streamed
        blocks = _keep_two_of_three(engine.recompute, middle=SLOTS * slot - room + 100)
        assert blocks == list(model)
        plan = partial(plan_split, window_ms=60.0, cpu_ms=150.0, bucket_numels=numels,
                       order=list(range(len(numels))), states=engine.host.state_count(),
                       bytes_h2d=0, bytes_d2h=0, bandwidth={"h2d": 1e12, "d2h": 1e12})

        def planned(room: int):
            return plan(room_bytes=room)

        assert not planned(room).share
        slow = StepTimes(compute_ms=3 * 3 * 200.0, backward_ms=60.0, cpu_ms=150.0)
        assert _slots_from_kept_blocks(engine, slow, 60.0, room, planned) is None
        assert engine.recompute.kept == 2  # a block's forward (200 ms) costs too much
        fast = StepTimes(compute_ms=90.0, backward_ms=60.0, cpu_ms=150.0)
        split = _slots_from_kept_blocks(engine, fast, 60.0, room, planned)
        assert split is not None and split.share > 0 and split.slots == SLOTS
        freed = SLOTS * slot - room + 100
        assert f"1 kept blocks recomputed again for the slots, {freed} bytes" in split.why
        assert engine.recompute.kept == 1 and "forward" in blocks[1].__dict__
        assert _slots_from_kept_blocks(engine, fast, 60.0, SLOTS * slot, planned) is None
    finally:
        engine.close()


def test_blocks_recomputed_again_take_their_bytes_out_of_the_batchs_model():
    peak = [0]

    def dry_run(count: int) -> None:
        peak[0] = 50 + count * 1024 * 100  # 100 bytes a token above 50 fixed

    split = _split(10**9, grads=0, peak=peak)
    assert split.plan(8, 1024, dry_run) is None and split.token_bytes == 100
    whole = split.whole_bytes()
    split.add_kept(8 * 1024 * 10)  # kept blocks: 10 bytes a token more
    assert split.token_bytes == 110 and split.whole_bytes() == whole + 8 * 1024 * 10
    split.add_kept(-8 * 1024 * 10)  # recomputed again
    assert split.token_bytes == 100 and split.whole_bytes() == whole
