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
    loop scales each loss by its share, as HF Trainer does), and the split's record."""
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
                    (loss / micro).backward()
                total += loss.item() / micro
            optimizer.step()
            optimizer.zero_grad()
            losses.append(total)
        record = memory.stats()["offload"]["chunked_loss"]["batch_split"]
    return losses, [p.detach().clone() for p in model.parameters()], record


@pytest.mark.parametrize("micro", [1, 2])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_split_batch_trains_as_the_whole_one(rows: int, micro: int):
    whole, whole_weights, record = _train(HostOptimizerOffload(batch_split=False,
                                                               micro_batches=micro), micro)
    assert record["parts"] == 1 and record["enabled"] is False
    split, split_weights, record = _train(HostOptimizerOffload(batch_split=rows,
                                                               micro_batches=micro), micro)
    assert record["parts"] == -(-ROWS // rows) and record["exact"] is True
    assert split == pytest.approx(whole, rel=1e-6)
    for a, b in zip(split_weights, whole_weights, strict=True):
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


def _split(room: int, grads: int, peak: list[int] | None = None) -> BatchSplit:
    """A split planning with these figures (nothing held; ``peak[0]`` the peak)."""
    peak = peak if peak is not None else [0]
    split = BatchSplit()
    split.bind(Measure(live_bytes=lambda: 0, peak_bytes=lambda: peak[0],
                       reset_peak=lambda: None, room=lambda: room, grad_bytes=grads))
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


def test_the_first_plan_measures_one_row_and_two_for_the_fixed_bytes():
    peak, counts = [0], []

    def dry_run(count):  # 100 bytes a token beside 4096 a forward holds whatever its rows
        assert split.dropping
        counts.append(count)
        peak[0] = count * 1024 * 100 + 4096

    split = _split(room=8 * 1024 * 100 + 4096 - 1, grads=2 * 1024 * 100, peak=peak)
    assert split.plan(8, 1024, dry_run) == 5  # not all 8 rows: 5 beside the gradient set
    assert counts == [1, 2] and not split.dropping
    assert (split.token_bytes, split.fixed_bytes) == (100, 4096)
    assert split.floor_bytes == 1024 * 100 + 4096 + 2 * 1024 * 100  # a row and the gradients
    assert split.floor_split
    assert split.plan(8, 512, _no_dry_run) is None  # half the tokens a row: the batch fits


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
