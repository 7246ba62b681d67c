"""The streamed budget strategy's logic on the CPU: the same training, bit for bit, whatever it
streams, offloads or recomputes (hpcmem.um.streamed with its CPU transport)."""

from __future__ import annotations

import contextlib
import re

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from um_functions import Block, Square  # noqa: E402

from hpcmem.errors import HpcmemError  # noqa: E402
from hpcmem.um import BudgetError  # noqa: E402
from hpcmem.um.budget import BudgetTooSmallError, CpuTransport  # noqa: E402
from hpcmem.um.streamed import Streamer  # noqa: E402
from hpcmem.um.streamed.engine import RESIDENT_BELOW  # noqa: E402
from hpcmem.um.streamed.optimizer import row_slices  # noqa: E402
from hpcmem.um.tensors import round_stochastic, tensor_bytes  # noqa: E402

MiB = 2**20
#: A budget above the least the probe step of ``Net`` holds (7 MB of copies), far below its
#: parameters' state.
TIGHT = 12 * MiB
ORDER = ("params", "activations", "inputs")


class Net(nn.Module):
    """Nested blocks, a module called twice, a tied weight, BatchNorm buffers, a custom
    function: what models hpcmem did not build do."""

    def __init__(self, width: int = 512, vocab: int = 1024) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        self.shared = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)
        self.weight = nn.Parameter(torch.randn(width, width) * 0.02)

    def forward(self, tokens):
        x = self.shared(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        x = Square.apply(self.norm(self.shared(x)), self.weight)
        return nn.functional.cross_entropy(x @ self.embed.weight.t(), tokens)


def _train(budget=None, steps=4, recompute=None, backwards=1, closure=False,
           state_dtype=None, working_dtype=None, rounded=False):
    """Losses, model, optimizer and streamer of ``steps`` AdamW steps; ``rounded`` (no
    budget): forward and backward read the parameters of 1 MiB or more rounded to bf16, the
    optimizer steps them unrounded (what working copies in bf16 compute)."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    streamer = None
    if budget is not None:
        streamer = Streamer(model, optimizer, transport=CpuTransport(), budget=budget,
                            priority=ORDER, device_scope=contextlib.nullcontext,
                            recompute=recompute, state_dtype=state_dtype,
                            working_dtype=working_dtype)
    generator = torch.Generator().manual_seed(1)
    losses = []
    large = [p for p in model.parameters() if tensor_bytes(p) >= RESIDENT_BELOW] if rounded else []

    def forward_backward():
        tokens = torch.randint(1024, (512,), generator=generator)
        masters = [p.detach().clone() for p in large]
        with torch.no_grad():
            for param in large:
                param.copy_(param.to(torch.bfloat16))
        with streamer.scope() if streamer else contextlib.nullcontext():
            loss = model(tokens)
            loss.backward()
        with torch.no_grad():
            for param, master in zip(large, masters, strict=True):
                param.copy_(master)
        losses.append(loss.item())
        return loss

    for _ in range(steps):
        if closure:  # as Lightning steps: the optimizer runs the forward and backward
            assert optimizer.step(forward_backward).item() == losses[-1]
        else:
            for _ in range(backwards):
                forward_backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return losses, model, optimizer, streamer


def _state(model, optimizer):
    tensors = [p.detach().clone() for p in model.parameters()]
    tensors += [b.clone() for b in model.buffers()]
    for param in model.parameters():
        tensors += [v.clone() for v in optimizer.state[param].values()]
    return tensors


@pytest.fixture(scope="module")
def reference():
    losses, model, optimizer, _ = _train()
    return losses, _state(model, optimizer)


@pytest.mark.parametrize(("budget", "recompute"), [
    (TIGHT, True), (TIGHT, False), (16 * MiB, None), (64 * MiB, None), (2**30, None),
])
def test_training_is_bitwise_the_same_under_any_budget(reference, budget, recompute):
    losses, model, optimizer, streamer = _train(budget, recompute=recompute)
    streamer.close()
    assert losses == reference[0]
    state = _state(model, optimizer)
    assert len(state) == len(reference[1])
    assert all(torch.equal(a, b) for a, b in zip(state, reference[1], strict=True))


def test_a_tight_budget_streams_parameters_and_offloads_activations():
    _, model, _, streamer = _train(TIGHT, recompute=False)
    stats = streamer.stats()
    streamed = [p for p in model.parameters() if p.numel() * p.element_size() >= 2 * MiB]
    param_bytes = sum(p.numel() * p.element_size() for p in streamed)
    # Every step fetches each streamed parameter at least once and sends its gradient home.
    assert stats["bytes_h2d"] >= param_bytes
    assert stats["bytes_d2h"] >= param_bytes
    assert stats["plan"]["recompute"] is False
    assert not any(e.resident for e in streamer.params.entries if e.nbytes >= 2 * MiB)
    # Between steps a streamed parameter lives in its host home, not a device copy.
    homes = {id(e.param): e.home for e in streamer.params.entries if not e.resident}
    assert all(p.data_ptr() == homes[id(p)].data_ptr() for p in streamed)
    streamer.close()


def test_a_large_budget_keeps_everything_on_the_device():
    _, model, _, streamer = _train(2**30)
    plan = streamer.stats()["plan"]
    assert plan["resident"] == len(list(model.parameters()))
    assert plan["recompute"] is False
    streamer.close()


def test_recomputation_restores_batchnorm_statistics_and_closes_cleanly(reference):
    _, model, optimizer, streamer = _train(TIGHT, recompute=True)
    assert streamer.recompute.enabled and streamer.recompute.saved_bytes
    assert all("forward" in block.__dict__ for block in model.blocks)
    streamer.close()
    assert all("forward" not in block.__dict__ for block in model.blocks)
    assert "step" not in optimizer.__dict__
    assert torch.equal(model.norm.running_mean, reference[1][len(list(model.parameters()))])


def test_gradients_accumulate_over_two_backwards_as_without_a_budget():
    expected, *_ = _train(steps=2, backwards=2)
    losses, *_, streamer = _train(TIGHT, steps=2, backwards=2, recompute=False)
    streamer.close()
    assert losses == expected


def test_a_closure_runs_once_before_the_step(reference):
    losses, *_, streamer = _train(TIGHT, closure=True, recompute=False)
    streamer.close()
    assert losses == reference[0]


def test_lbfgs_is_refused():
    model = Net()
    with pytest.raises(BudgetError, match="LBFGS") as error:
        Streamer(model, torch.optim.LBFGS(model.parameters()), transport=CpuTransport(),
                 budget=TIGHT, priority=ORDER, device_scope=contextlib.nullcontext)
    assert isinstance(error.value, HpcmemError)


def test_a_budget_below_what_the_probe_step_needs_is_refused_with_both_figures():
    with pytest.raises(BudgetTooSmallError) as raised:
        _train(MiB, steps=1)
    error = raised.value
    assert error.budget == MiB and error.minimum > MiB
    assert f"{MiB} bytes" in str(error) and f"{error.minimum} bytes" in str(error)
    assert isinstance(error, BudgetError)
    # what the floor is made of: the largest block by name, and what the host holds already
    assert re.search(r"the largest parameter streamed in \d\.\d\d GiB; .*the largest block "
                     r"blocks\.\d \(Block\) \d\.\d\d GiB while it recomputes; already off the "
                     r"device: parameters, gradients and optimizer state on the host \d\.\d\d "
                     r"GiB, saved activations on the host .*, 3 blocks recomputed$",
                     error.detail), error.detail


def test_a_recomputation_that_stops_early_leaves_no_parameter_on_the_device():
    # A recomputation stops (raises) inside the last module that saves for backward, whose
    # closing hook then never runs: its parameter must still be dropped, or each block's
    # backward leaves one more parameter copy on the device.
    torch.manual_seed(0)
    model = Net()
    transport = CpuTransport()
    streamer = Streamer(model, None, transport=transport, budget=TIGHT, priority=ORDER,
                        device_scope=contextlib.nullcontext, recompute=True)
    live = []
    for block in model.blocks:
        block.register_full_backward_hook(lambda *_: live.append(transport.live_bytes()))
    tokens = torch.randint(1024, (512,), generator=torch.Generator().manual_seed(1))
    with streamer.scope():
        model(tokens).backward()
    streamer.close()
    assert len(live) == len(model.blocks)
    assert max(live) == min(live), f"device bytes grew block by block in backward: {live}"


def test_an_entry_larger_than_the_slice_limit_steps_in_slices_bit_for_bit(reference):
    losses, model, optimizer, streamer = _train(TIGHT)
    largest = max(streamer.params.entries, key=lambda e: e.state_bytes)
    pieces = row_slices(largest, streamer.chunked.slice_bytes)
    streamer.close()
    assert len(pieces) > 1 and sum(p.stop - p.start for p in pieces) == largest.param.shape[0]
    assert losses == reference[0]
    assert all(torch.equal(a, b) for a, b in zip(_state(model, optimizer), reference[1],
                                                  strict=True))


def test_moments_kept_in_bf16_take_half_their_homes_and_train_as_fp32_moments_do(reference):
    """Losses within 1e-4 relative of fp32 moments' over four AdamW steps of lr 1e-3, the
    weights within 1e-5 on average. An element's Adam update is about lr whatever its
    moments, so none can differ by more than 2 x 4 x lr; the few whose gradients are near
    zero come closest (an embedding's rare rows, the last block's bias, 3e-4 on average),
    as they do under plain AdamW with its moments rounded to bf16 between steps."""
    losses, model, optimizer, streamer = _train(TIGHT, state_dtype="bfloat16")
    entries = [e for e in streamer.params.entries if e.states]
    homes = [home for e in entries for home in e.states.values()]
    assert homes and all(home.dtype == torch.bfloat16 for home in homes)
    for entry in entries:
        narrowed = sum(2 * home.numel() for home in entry.states.values())
        assert entry.home_bytes == entry.state_bytes - narrowed  # the device steps in fp32
    assert streamer.stats()["state_dtype"] == "bfloat16"
    streamer.close()
    assert losses == pytest.approx(reference[0], rel=1e-4)
    assert losses != reference[0]  # the moments were rounded
    state = _state(model, optimizer)
    assert all(t.dtype == r.dtype for t, r in zip(state, reference[1], strict=True))  # fp32
    weights = len(list(model.parameters()))
    apart = torch.cat([(ours - theirs).abs().flatten()
                       for ours, theirs in zip(state[:weights], reference[1], strict=False)])
    assert apart.mean().item() < 1e-5 and apart.max().item() < 8e-3


def test_moments_kept_in_bf16_step_in_fp32_once_the_plan_keeps_them_on_the_device(reference):
    """At 64 MiB the plan makes some streamed parameters resident after the probe: their
    moments come from their bf16 homes widened, so the device steps them in fp32 as it
    steps streamed ones."""
    losses, _, optimizer, streamer = _train(64 * MiB, state_dtype="bfloat16")
    kept = [e for e in streamer.params.entries if e.resident and e.nbytes >= RESIDENT_BELOW]
    assert kept and not any(e.states for e in kept)
    moments = [v for e in kept for v in optimizer.state[e.param].values() if v.numel() > 1]
    assert moments and all(v.dtype == torch.float32 for v in moments)
    streamer.close()
    assert losses == pytest.approx(reference[0], rel=1e-4)


def test_stochastic_rounding_to_bf16_is_exact_on_average_and_seeded():
    value = 1 + 2**-10  # a quarter of the way from 1 to the next bf16 value, 1 + 2^-7
    tensor = torch.full((100_000,), value)
    rounded = round_stochastic(tensor, torch.bfloat16, seed=3)
    assert set(rounded.float().unique().tolist()) == {1.0, 1 + 2**-7}
    assert rounded.float().mean().item() == pytest.approx(value, abs=2**-7 / 100)
    assert tensor.to(torch.bfloat16).float().mean().item() == 1.0  # to nearest: biased
    assert torch.equal(rounded, round_stochastic(tensor, torch.bfloat16, seed=3))
    assert not torch.equal(rounded, round_stochastic(tensor, torch.bfloat16, seed=4))
    assert round_stochastic(-tensor, torch.bfloat16, seed=3).float().mean().item() == (
        pytest.approx(-value, abs=2**-7 / 100))


def test_working_copies_in_bf16_compute_as_rounded_weights_and_step_fp32_masters():
    """Every streamed fp32 parameter is fetched from its bf16 copy: the losses and the fp32
    masters are bit for bit those of a run reading its large parameters rounded to bf16,
    and each fetch copies half the bytes."""
    expected, model, optimizer, _ = _train(rounded=True)
    rounded_state = _state(model, optimizer)
    losses, model, optimizer, streamer = _train(TIGHT, recompute=True,
                                                working_dtype="bfloat16")
    streamed = [e for e in streamer.params.entries if not e.resident]
    assert streamed and all(e.working.dtype == torch.bfloat16 for e in streamed)
    assert all(e.fetch_bytes * 2 == e.nbytes for e in streamed)
    moved = streamer.stats()["bytes_h2d"]
    streamer.close()
    assert losses == expected
    assert all(torch.equal(a, b) for a, b in zip(_state(model, optimizer), rounded_state,
                                                  strict=True))
    *_, whole = _train(TIGHT, recompute=True)
    assert moved < whole.stats()["bytes_h2d"]
    whole.close()


@pytest.mark.parametrize("state_dtype", [None, "bfloat16"])
def test_adams_state_is_reserved_with_the_homes_before_it_exists(state_dtype):
    """AdamW makes its moments at the first step: their homes are reserved at attach, so
    the arena does not grow then, each moment in a chunk of its own."""
    _, model, optimizer, streamer = _train(TIGHT, steps=0, state_dtype=state_dtype,
                                           working_dtype="bfloat16")
    reserved = streamer.stats()["host_homes_bytes"]
    streamed = [e for e in streamer.params.entries if not e.resident]
    moment = 2 if state_dtype else 4  # bytes an element
    homes = sum(e.nbytes * 2 + e.param.numel() * (2 * moment + 2) for e in streamed)
    assert reserved >= homes  # parameter, gradient, two moments, the bf16 copy
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        with streamer.scope():
            model(torch.randint(1024, (512,), generator=generator)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    assert optimizer.state  # the moments exist now
    assert streamer.stats()["host_homes_bytes"] == reserved
    streamer.close()


def test_the_host_memory_splits_into_homes_and_saved_buffers():
    *_, streamer = _train(TIGHT, recompute=True, working_dtype="bfloat16")
    stats = streamer.stats()
    assert stats["host_bytes"] == stats["host_homes_bytes"] + stats["host_saved_bytes"]
    assert stats["saved_bytes"] == sum(streamer.saved.candidates)
    streamer.close()


def test_a_state_dict_loaded_into_the_homes_reaches_the_working_copies():
    _, model, _, streamer = _train(TIGHT, steps=2, working_dtype="bfloat16")
    torch.manual_seed(7)
    other = Net()
    model.load_state_dict(other.state_dict())
    tokens = torch.randint(1024, (512,), generator=torch.Generator().manual_seed(9))
    with streamer.scope():
        loss = model(tokens)
        loss.backward()
    streamer.close()
    with torch.no_grad():
        for param in other.parameters():
            if tensor_bytes(param) >= RESIDENT_BELOW:
                param.copy_(param.to(torch.bfloat16))
    assert loss.item() == other(tokens).item()


def test_working_copies_are_left_out_where_host_memory_cannot_hold_them(caplog):
    from hpcmem.um.streamed.params import Entry
    from hpcmem.um.streamed.working import WorkingCopies

    entries = [Entry(i, torch.nn.Parameter(torch.zeros(256, 1024)), MiB) for i in range(4)]
    homes = 4 * 4 * MiB  # parameter, gradient and two moments each
    assert WorkingCopies("bfloat16").fit(entries, homes, homes + 2 * MiB) == 2 * MiB
    assert WorkingCopies("bfloat16").fit(entries, homes, None) == 2 * MiB
    copies = WorkingCopies("bfloat16")
    assert copies.fit(entries, homes, homes + 2 * MiB - 1) == 0
    assert copies.name is None and not copies.applies(entries[0])
    assert "no bfloat16 working copies: the homes take 0.0 GiB and the copies 0.0 GiB more" \
        in caplog.text
    assert WorkingCopies("float32").fit(entries, homes, 0) == 0  # not narrower: none


@pytest.mark.parametrize(("make", "count"), [
    (lambda params: torch.optim.AdamW(params), 2),
    (lambda params: torch.optim.Adam(params, amsgrad=True), 3),
    (lambda params: torch.optim.SGD(params, lr=0.1), 0),
    (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), 1),
])
def test_the_state_an_optimizer_makes_at_its_first_step_is_known_before(make, count):
    from hpcmem.um.budget.offload import lazy_state_tensors

    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = make([param])
    assert lazy_state_tensors(optimizer) == count
    param.grad = torch.ones(3)
    optimizer.step()
    assert sum(v.shape == param.shape for v in optimizer.state[param].values()) == count
    assert lazy_state_tensors(torch.optim.Adagrad([param])) == 0  # not known: none
