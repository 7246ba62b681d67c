"""The host-optimizer budget mode on the CPU (hpcmem.um.host_optimizer with the CPU
transport): buckets, the host step, the plan's choice, and training that agrees with a plain
optimizer within floating-point tolerance."""

from __future__ import annotations

import contextlib
import itertools
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from um_functions import VOCAB, Net, make_optimizer  # noqa: E402

from hpcmem.um import BudgetError  # noqa: E402
from hpcmem.um.budget import BudgetTooSmallError, CpuTransport  # noqa: E402
from hpcmem.um.budget.offload import (  # noqa: E402
    HostOptimizerOffload,
    Offload,
    StreamedOffload,
    choose_strategy,
    host_optimizer_bytes,
    offload_named,
    staging_bytes,
    sums_micro_batches_on_host,
)
from hpcmem.um.budget.phases import Phase  # noqa: E402
from hpcmem.um.host_optimizer import HostOptimizer, cores, lay_out  # noqa: E402
from hpcmem.um.host_optimizer.buckets import ALIGN  # noqa: E402
from hpcmem.um.host_optimizer.split import (  # noqa: E402
    PLAN_AFTER,
    ROOM_MARGIN,
    plan_split,
    slot_bytes,
)
from hpcmem.um.host_optimizer.staging import OutRing  # noqa: E402
from hpcmem.um.host_optimizer.worker import Worker  # noqa: E402
from hpcmem.um.strategy import make_strategy, planned, working_bytes  # noqa: E402

BUDGET = 2**30
def _train(offload=None, steps=5, micro_batches=1, kind="AdamW", groups=False, bf16=False,
           bucket_bytes=64 * 1024, lr_at=None, state_first=False, closure=False,
           budget=BUDGET, clip=None):
    torch.manual_seed(0)
    model = Net()
    optimizer = make_optimizer(model, kind, groups)
    if state_first:  # state made before attach, as hpcmem train's loop makes it
        for p in model.parameters():
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        rates = [g["lr"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:
            g["lr"] = 0.0
        optimizer.step()
        for g, rate in zip(optimizer.param_groups, rates, strict=True):
            g["lr"] = rate
        optimizer.zero_grad(set_to_none=True)
    engine = None
    if offload is not None:
        engine = HostOptimizer(
            model, optimizer, transport=CpuTransport(), budget=budget,
            offload=HostOptimizerOffload(**{"bucket_bytes": bucket_bytes,
                                            "micro_batches": micro_batches, **offload}),
            device_scope=contextlib.nullcontext,
        )
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        if lr_at is not None and step == lr_at:
            for group in optimizer.param_groups:
                group["lr"] *= 0.1
        for micro in range(micro_batches):
            tokens = torch.randint(VOCAB, (256,), generator=generator)

            def forward_backward(tokens=tokens):
                with engine.scope() if engine else contextlib.nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        loss = model(tokens) / micro_batches
                    loss.backward()
                losses.append(loss.item())
                return loss

            if closure and micro == micro_batches - 1:  # as Lightning steps
                assert optimizer.step(forward_backward).item() == losses[-1]
            else:
                forward_backward()
        if clip is not None and engine is None:  # the reference: clipped by PyTorch
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if not closure:
            optimizer.step()
        optimizer.zero_grad()
    return losses, model, optimizer, engine


def _close(engine, model):
    engine.close()
    return [p.detach().float().clone() for p in model.parameters()]


def _agree(ours, reference, relative):
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference, strict=True):
        assert abs(a - b) <= relative * abs(b), (a, b)


# -- buckets -------------------------------------------------------------------------------
def test_buckets_keep_groups_apart_fill_to_the_limit_and_align_every_slot():
    params = [torch.empty(n) for n in (100, 10, 300, 10, 5000, 10)]
    groups = [0, 1, 0, 1, 0, 1]
    buckets = lay_out(params, groups, bucket_bytes=2048 * 4, itemsize=4)
    assert [[p.numel() for p in b.params] for b in buckets] == [[100, 300], [5000], [10, 10, 10]]
    assert [b.group for b in buckets] == [0, 0, 1]
    assert [b.index for b in buckets] == [0, 1, 2]
    assert all(o % ALIGN == 0 for b in buckets for o in b.offsets)
    flat = torch.arange(buckets[0].numel, dtype=torch.float32)
    assert buckets[0].slot(flat, 1).shape == (300,)
    assert buckets[0].slot(flat, 1)[0] == buckets[0].offsets[1]


def test_a_parameter_larger_than_a_bucket_gets_its_own():
    buckets = lay_out([torch.empty(10), torch.empty(10_000), torch.empty(10)], [0, 0, 0],
                      bucket_bytes=400, itemsize=4)
    assert [[p.numel() for p in b.params] for b in buckets] == [[10], [10_000], [10]]


# -- the plan's choice ---------------------------------------------------------------------
def test_the_plan_keeps_working_weights_on_the_gpu_when_half_the_budget_holds_them():
    budget = 16 * 2**30
    assert choose_strategy(budget, 2 * 2**30, 1, "AdamW") == "host_optimizer"
    assert choose_strategy(budget, 8 * 2**30 - 2**27, 1, "AdamW") == "streamed"
    # micro-batches: their gradients sum on the device beside the working weights where
    # both fit the share, else in host memory
    assert choose_strategy(budget, 4 * 2**30, 2, "AdamW") == "host_optimizer"
    assert not sums_micro_batches_on_host(2 * 2**30, 2, budget)
    assert sums_micro_batches_on_host(4 * 2**30, 2, budget)
    assert not sums_micro_batches_on_host(4 * 2**30, 1, budget)  # nothing to sum
    assert not sums_micro_batches_on_host(6 * 2**30, 2, budget, host_accumulation=False)
    assert sums_micro_batches_on_host(2**20, 2, budget, host_accumulation=True)
    assert choose_strategy(budget, 8 * 2**30, 2, "AdamW") == "streamed"
    assert choose_strategy(budget, 2 * 2**30, 1, "Adagrad") == "streamed"
    # the copies' buffers: a sixteenth of the budget, at most 128 MiB, and a quarter of that
    assert host_optimizer_bytes(2**30, 1, budget) == 2**30 + 128 * 2**20 + 32 * 2**20
    assert staging_bytes(2**30) == (64 * 2**20, 16 * 2**20)


class _CountingTransport(CpuTransport):
    """The CPU transport, counting its copies out."""

    def __init__(self) -> None:
        super().__init__()
        self.copies_out = 0

    def offload(self, device_tensor, host, hold=True):
        self.copies_out += 1
        return super().offload(device_tensor, host, hold)


def test_gradients_leave_through_a_ring_smaller_than_them():
    ring = OutRing(CpuTransport(), 100)
    sent = [torch.randn(250, dtype=torch.bfloat16), torch.randn(7, 9), torch.randn(60)]
    homes = [torch.zeros(t.numel()) for t in sent]
    for key, (tensor, home) in enumerate(zip(sent, homes, strict=True)):
        ring.send(tensor, home, 0, key=key)
        ring.flush(key)
    for tensor, home in zip(sent, homes, strict=True):
        assert torch.equal(home, tensor.float().reshape(-1))


def test_a_buckets_gradients_leave_in_one_copy_when_the_ring_holds_them():
    transport = _CountingTransport()
    ring = OutRing(transport, 1000)
    home = torch.zeros(192)
    grads = [torch.randn(64) for _ in range(3)]
    for position, grad in enumerate(grads):
        ring.send(grad, home, 64 * position, key="bucket")
    assert transport.copies_out == 0  # nothing leaves before the bucket is complete
    ring.flush("bucket")
    assert transport.copies_out == 1
    assert torch.equal(home, torch.cat(grads))
    ring.clear()


def test_interleaved_buckets_and_a_full_ring_still_land_every_gradient():
    transport = _CountingTransport()
    ring = OutRing(transport, 100)
    homes = {"a": torch.zeros(256), "b": torch.zeros(256)}
    sent = {"a": torch.randn(256), "b": torch.randn(256)}
    for start in range(0, 256, 64):  # out of order in the host buffer, and the ring wraps
        for key in ("b", "a"):
            ring.send(sent[key][start : start + 64], homes[key], start, key=key)
    with pytest.raises(RuntimeError, match=r"copies of \['a'\] were never flushed"):
        ring.clear()
    for key in ("a", "b"):
        ring.flush(key)
        assert torch.equal(homes[key], sent[key])
    assert transport.copies_out == 8  # the ring holds one gradient at a time: no merging
    ring.clear()


def test_make_strategy_follows_the_plan_or_the_value():
    model = Net()
    optimizer = make_optimizer(model)
    size = working_bytes(model, "bfloat16")
    assert size == sum(p.numel() * 2 for p in model.parameters()) + 128 * 4
    engine = make_strategy(model, optimizer, offload=Offload(), transport=CpuTransport(),
                           budget=BUDGET, priority=("params", "activations", "inputs"),
                           device_scope=contextlib.nullcontext)
    assert isinstance(engine.current, HostOptimizer)
    engine.close()
    streamed = make_strategy(model, optimizer, offload=StreamedOffload(),
                             transport=CpuTransport(), budget=BUDGET,
                             priority=("params", "activations", "inputs"),
                             device_scope=contextlib.nullcontext)
    assert streamed.stats()["strategy"] == "streamed"
    streamed.close()


def test_the_plan_gives_a_plain_value_the_chosen_strategy_and_its_shared_fields():
    model = Net()
    plain = Offload(working_dtype="bfloat16", micro_batches=2, recompute=False)
    chosen = planned(plain, model, make_optimizer(model), BUDGET)
    assert chosen == HostOptimizerOffload(working_dtype="bfloat16", micro_batches=2,
                                          recompute=False)
    assert planned(plain, model, torch.optim.Adagrad(model.parameters()), BUDGET) == \
        StreamedOffload(working_dtype="bfloat16", micro_batches=2, recompute=False)
    given = StreamedOffload()
    assert planned(given, model, make_optimizer(model), BUDGET) is given


def test_an_offload_value_is_checked():
    with pytest.raises(BudgetError, match="micro_batches"):
        Offload(micro_batches=0)
    with pytest.raises(BudgetError, match="working_dtype"):
        StreamedOffload(working_dtype="int8")
    with pytest.raises(BudgetError, match="state_dtype: 'float16' is not one of float32, "
                                          "bfloat16"):
        HostOptimizerOffload(state_dtype="float16")
    with pytest.raises(BudgetError, match="state_dtype: 'float16' is not one of"):
        StreamedOffload(state_dtype="float16")
    with pytest.raises(TypeError, match="gpu_share"):
        StreamedOffload(gpu_share=0.5)  # the type carries its own fields only


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("recompute", "false", "true, false or null"),  # a string would read as true
    ("micro_batches", "2", "an integer"),
    ("micro_batches", True, "an integer"),
    ("chunked_loss", 1, "true, false or null"),
    ("delayed_update", "no", "true or false"),
    ("host_accumulation", 0, "true, false or null"),
    ("bucket_bytes", 2.5e7, "an integer"),
    ("threads", "8", "an integer or null"),
    ("gpu_share", True, "a number or null"),
    ("max_grad_norm", "1.0", "a number or null"),
])
def test_a_field_of_the_wrong_kind_is_refused_naming_what_it_takes(field, value, accepted):
    with pytest.raises(BudgetError, match=f"^offload {field}: {re.escape(repr(value))} is not "
                                          f"{accepted}$"):
        HostOptimizerOffload(**{field: value})


def test_numbers_of_numpy_kinds_are_taken():
    offload = HostOptimizerOffload(micro_batches=np.int64(2), gpu_share=np.float32(0.5))
    assert offload.micro_batches == 2 and offload.gpu_share == 0.5


def test_a_value_is_made_from_a_strategy_name_and_fields():
    assert offload_named(None, working_dtype="bfloat16") == Offload(working_dtype="bfloat16")
    assert offload_named("streamed", micro_batches=2) == StreamedOffload(micro_batches=2)
    # a host optimizer's field away from its default names that strategy; at it, nothing
    assert offload_named(None, delayed_update=True) == HostOptimizerOffload(delayed_update=True)
    assert offload_named(None, delayed_update=False, gpu_share=None) == Offload()
    assert (offload_named("streamed", state_dtype="bfloat16")
            == StreamedOffload(state_dtype="bfloat16"))  # every strategy's field
    with pytest.raises(BudgetError, match="offload strategy: 'zero' is not one of "
                                          "host_optimizer, streamed"):
        offload_named("zero")
    with pytest.raises(BudgetError, match=r"gpu_share: 0\.5 applies to strategy "
                                          "host_optimizer only, not to strategy streamed"):
        offload_named("streamed", gpu_share=0.5)
    record = HostOptimizerOffload(gpu_share=0.5).to_record()
    assert record["strategy"] == "host_optimizer" and record["gpu_share"] == 0.5
    assert offload_named(**record) == HostOptimizerOffload(gpu_share=0.5)
    assert Offload().to_record() == {"strategy": None, "working_dtype": None,
                                     "micro_batches": 1, "recompute": None,
                                     "chunked_loss": None, "state_dtype": None}


def test_an_optimizer_the_host_cannot_step_is_refused():
    model = Net()
    with pytest.raises(BudgetError, match="Adagrad"):
        HostOptimizer(model, torch.optim.Adagrad(model.parameters()), transport=CpuTransport(),
                      budget=BUDGET, offload=HostOptimizerOffload(),
                      device_scope=contextlib.nullcontext)


# -- training ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
def test_fp32_training_agrees_with_the_plain_optimizer(kind):
    reference, ref_model, *_ = _train(kind=kind, groups=True)
    ours, model, _, engine = _train({}, kind=kind, groups=True)
    _agree(ours, reference, 1e-4)
    weights = _close(engine, model)
    for a, b in zip(weights, ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_clipping_by_global_norm_agrees_with_pytorchs(kind):
    reference, ref_model, *_ = _train(kind=kind, groups=True, clip=0.05)
    ours, model, _, engine = _train({"max_grad_norm": 0.05}, kind=kind, groups=True, clip=0.05)
    _agree(ours, reference, 1e-4)
    clip = engine.stats()["clip"]
    assert clip["grad_norm"] > 0.05 and clip["skipped_steps"] == 0  # it did clip
    for a, b in zip(_close(engine, model), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-6)


def test_a_step_whose_norm_is_not_finite_is_skipped():
    _, model, optimizer, engine = _train({"max_grad_norm": 1.0}, steps=1)
    before = [p.detach().clone() for p in model.parameters()]
    with engine.scope():
        (model(torch.arange(8)) * float("inf")).backward()
    optimizer.step()
    assert engine.stats()["clip"]["skipped_steps"] == 1
    for a, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(a.detach(), b)


def test_clipping_refuses_what_steps_during_backward():
    with pytest.raises(BudgetError, match=r"^offload max_grad_norm: 1.0 cannot go with "
                       r"delayed_update=True \(the norm needs every gradient"):
        HostOptimizerOffload(max_grad_norm=1.0, delayed_update=True)
    with pytest.raises(BudgetError, match=r"^offload max_grad_norm: 0 must be a positive"):
        HostOptimizerOffload(max_grad_norm=0)


@pytest.mark.parametrize(("kind", "asked", "kernel", "wire"), [
    ("AdamW", None, "hpcmem-", 2), ("AdamW", "torch", "torch-fused", 4),
    ("SGD", None, "torch-fused", 4)])
def test_bf16_working_weights_agree_within_one_percent(kind, asked, kernel, wire):
    reference, *_ = _train(bf16=True, steps=8, kind=kind)
    ours, model, _, engine = _train({"working_dtype": "bfloat16", "host_kernel": asked},
                                    bf16=True, steps=8, kind=kind)
    _agree(ours, reference, 1e-2)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    stats = engine.stats()
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # once per step each way: bf16 where hpcmem's kernel reads and writes it, else fp32
    # (the casts then run on the device)
    assert stats["host_kernel"].startswith(kernel)
    assert stats["bytes_d2h"] == wire * trained
    assert stats["bytes_h2d"] >= wire * trained  # with the buckets' alignment padding
    assert stats["working_dtype"] == "bfloat16"
    assert stats["cpu_optimizer_ms"] > 0
    assert stats["step_bound_ms"] >= stats["cpu_optimizer_ms"]
    assert 0 < stats["backward_ms"] < stats["compute_ms"]  # forward ran before it
    weights = _close(engine, model)
    assert all(w.dtype == torch.float32 for w in weights)


def test_bf16_moments_train_within_one_percent_and_come_back_in_fp32():
    reference, *_ = _train(bf16=True, steps=8)
    ours, model, optimizer, engine = _train(
        {"working_dtype": "bfloat16", "state_dtype": "bfloat16"}, bf16=True, steps=8)
    _agree(ours, reference, 1e-2)
    assert engine.stats()["state_dtype"] == "bfloat16"
    assert {engine.host.state(i)["exp_avg_sq"].dtype for i in range(len(engine.buckets))} == {
        torch.bfloat16}
    engine.close()
    for param in (p for p in model.parameters() if p.requires_grad):
        state = optimizer.state[param]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
        assert state["exp_avg"].shape == param.shape
        assert float(state["step"]) == 8.0


def test_micro_batches_accumulate_and_step_once():
    reference, *_ = _train(micro_batches=3, steps=3)
    ours, _, _, engine = _train({}, micro_batches=3, steps=3)
    _agree(ours, reference, 1e-4)
    assert engine.stats()["steps"] == 3
    engine.close()


def test_a_closure_runs_once_before_the_step():
    reference, *_ = _train(micro_batches=2, steps=3)
    ours, _, _, engine = _train({}, micro_batches=2, steps=3, closure=True)
    _agree(ours, reference, 1e-4)
    assert engine.stats()["steps"] == 3
    engine.close()


def test_a_step_before_the_last_micro_batch_sends_what_accumulated():
    # 2 micro-batches declared, 1 run: optimizer.step() sends the gradients
    reference, *_ = _train(steps=3)
    ours, _, _, engine = _train({"micro_batches": 2}, steps=3)
    _agree(ours, reference, 1e-4)
    engine.close()


def test_more_backward_passes_than_declared_are_refused():
    model = Net()
    optimizer = make_optimizer(model)
    engine = HostOptimizer(model, optimizer, transport=CpuTransport(), budget=BUDGET,
                           offload=HostOptimizerOffload(),
                           device_scope=contextlib.nullcontext)
    tokens = torch.randint(VOCAB, (64,))
    with engine.scope():
        model(tokens).backward()
    with pytest.raises(BudgetError, match="micro_batches"), engine.scope():
        model(tokens).backward()
    engine.close()


def test_learning_rate_changes_and_state_made_before_attach_carry_over():
    reference, _, plain, _ = _train(lr_at=2, state_first=True, groups=True)
    ours, _, optimizer, engine = _train({}, lr_at=2, state_first=True, groups=True)
    _agree(ours, reference, 1e-4)
    engine.close()  # the state is the optimizer's again, with its step count
    steps = [float(s["step"]) for s in optimizer.state.values()]
    assert steps == [float(s["step"]) for s in plain.state.values()] == [6.0] * len(steps)


def test_a_budget_below_the_first_step_is_refused_with_its_minimum():
    model = Net()
    optimizer = make_optimizer(model)
    engine = HostOptimizer(model, optimizer, transport=CpuTransport(), budget=1024,
                           offload=HostOptimizerOffload(),
                           device_scope=contextlib.nullcontext)
    with pytest.raises(BudgetTooSmallError) as refused, engine.scope():
        model(torch.randint(VOCAB, (64,))).backward()
    assert refused.value.minimum > 1024
    engine.close()


# -- a share of the buckets stepped by the device --------------------------------------------
def _streaming_budget():
    """A budget whose room above a step holds two slots of a block's bucket, not the tied
    embedding's (the bucket completed last): the GPU's share is streamed, none kept."""
    *_, engine = _train({"gpu_share": 0}, steps=3)
    held = max(engine.probe_bytes, engine.transport.resident_peak_bytes())
    engine.close()
    embedding = slot_bytes(VOCAB * 128, 2)
    return int((held + embedding * 3 // 4) / (1 - ROOM_MARGIN))


@pytest.mark.parametrize("kind", ["AdamW", "Adam", "SGD"])
@pytest.mark.parametrize("placement", ["resident", "streamed"])
def test_buckets_the_device_steps_agree_with_the_plain_optimizer(kind, placement):
    budget = BUDGET if placement == "resident" else _streaming_budget()
    steps = {"lr_at": PLAN_AFTER + 1, "steps": PLAN_AFTER + 3}
    reference, ref_model, plain, _ = _train(kind=kind, groups=True, **steps)
    ours, model, optimizer, engine = _train({"gpu_share": 0.5}, kind=kind, groups=True,
                                            budget=budget, **steps)
    _agree(ours, reference, 1e-4)
    split = engine.stats()["split"]
    assert split[f"{placement}_buckets"], split
    assert 0 < split["share"] < 1, split
    weights = _close(engine, model)
    for a, b in zip(weights, ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-6)
    trained = [(a, b) for a, b in zip(model.parameters(), ref_model.parameters(), strict=True)
               if a.requires_grad]
    for mine, theirs in trained:  # the step count and the state came home
        for key, value in plain.state[theirs].items():
            torch.testing.assert_close(optimizer.state[mine][key].float(), value.float(),
                                       rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("placement", ["resident", "streamed"])
def test_buckets_the_device_steps_take_bf16_moments_in_fp32(placement):
    budget = BUDGET if placement == "resident" else _streaming_budget()
    steps = {"steps": PLAN_AFTER + 3}
    reference, *_ = _train(**steps)
    ours, _, _, engine = _train({"gpu_share": 0.5, "state_dtype": "bfloat16"}, budget=budget,
                                **steps)
    _agree(ours, reference, 1e-2)
    split = engine.stats()["split"]
    assert split[f"{placement}_buckets"], split
    on_gpu = set(split["resident_buckets"]) | set(split["streamed_buckets"])
    dtypes = {i: engine.host.state(i)["exp_avg"].dtype for i in range(len(engine.buckets))}
    assert {dtypes[i] for i in on_gpu} == {torch.float32}
    assert {dtype for i, dtype in dtypes.items() if i not in on_gpu} == {torch.bfloat16}
    engine.close()


def test_buckets_kept_on_the_device_move_nothing_after_the_plan():
    reference, *_ = _train(steps=PLAN_AFTER + 2)
    ours, _, _, engine = _train({"gpu_share": 1.0}, steps=PLAN_AFTER + 2)
    _agree(ours, reference, 1e-4)
    split = engine.stats()["split"]
    assert split["share"] == 1.0 and not split["streamed_buckets"], split
    elements = sum(b.numel for b in engine.buckets)
    # the steps on the CPU (the plan's measurements): fp32 master in, gradient out
    assert engine.ledger.h2d == engine.ledger.d2h == PLAN_AFTER * 4 * elements
    engine.close()


def test_streamed_buckets_move_master_and_state_not_gradients():
    reference, *_ = _train(steps=PLAN_AFTER + 2)
    ours, _, _, engine = _train({"gpu_share": 1.0}, steps=PLAN_AFTER + 2,
                                budget=_streaming_budget())
    _agree(ours, reference, 1e-4)
    split = engine.stats()["split"]
    assert split["streamed_buckets"] and not split["resident_buckets"], split
    elements = sum(b.numel for b in engine.buckets)
    streamed = sum(engine.buckets[i].numel for i in split["streamed_buckets"])
    # the steps on the CPU: fp32 master in, gradient out; then two with the streamed
    # buckets' master and AdamW's two moments each way, the rest as before
    for moved in (engine.ledger.h2d, engine.ledger.d2h):
        assert moved == PLAN_AFTER * 4 * elements + 2 * (12 * streamed
                                                         + 4 * (elements - streamed))
    engine.close()


RATES = {"h2d": 50e9, "d2h": 50e9}


def _plan(numels, **kwargs):
    """``plan_split`` of buckets completed in bucket order, 2.7 GB each way per step."""
    return plan_split(**{"window_ms": 150, "cpu_ms": 100,
                         "bucket_numels": numels, "order": list(range(len(numels))),
                         "states": 2, "bytes_h2d": 2.7e9, "bytes_d2h": 2.7e9,
                         "bandwidth": RATES, "room_bytes": 2**31, **kwargs})


def test_the_room_keeps_the_tail_of_backward_on_the_device():
    slot = slot_bytes(2**25, 2)
    # the CPU within backward: completed last, buckets 19, 18 and 17; no room for a fourth
    split = _plan([2**25] * 20, room_bytes=3 * slot + slot // 2)
    assert split.resident_buckets == (17, 18, 19) and split.streamed_buckets == ()
    assert split.share == pytest.approx(3 / 20)


def test_a_cpu_slower_than_backward_streams_first_then_keeps_the_tail():
    slot = slot_bytes(2**25, 2)
    # 300 ms of CPU against 150 of backward: half the elements, through two slots, spread
    # over backward; the room left keeps the last completed bucket not streamed
    split = _plan([2**25] * 20, cpu_ms=300, room_bytes=3 * slot + slot // 2)
    assert split.slots == 2 and split.slot_numel == 2**25
    assert len(split.streamed_buckets) == 10
    assert min(b - a for a, b in itertools.pairwise(split.streamed_buckets)) >= 2
    assert split.resident_buckets == (max(set(range(20)) - set(split.streamed_buckets)),)
    assert split.share == pytest.approx(11 / 20)


def test_the_stream_is_limited_by_what_pcie_carries_and_the_room():
    numels = [2**25] * 20
    # within a 200 ms backward PCIe carries 10 GB each way, 8 of it taken: 2 GB more, 37%
    # of the elements streamed, under the 50% the CPU wants
    split = _plan(numels, cpu_ms=400, window_ms=200, bytes_h2d=8e9,
                  room_bytes=2 * slot_bytes(2**25, 2))
    assert split.share == pytest.approx(2e9 / (8 * 20 * 2**25), abs=0.03)
    # PCIe full within backward: nothing streams
    assert _plan(numels, cpu_ms=300, bytes_h2d=10e9).streamed_buckets == ()
    # no room for two slots of a bucket: nothing streams, one bucket is kept
    tight = _plan(numels, cpu_ms=300, room_bytes=2 * slot_bytes(2**25, 2) - 1)
    assert tight.streamed_buckets == () and tight.resident_buckets == (19,)


def test_a_share_asked_for_is_kept_then_streamed_as_the_room_allows():
    # the bucket completed last is too large to keep: the share is streamed
    split = _plan([2**25] * 19 + [2**28], asked=0.25)
    assert split.resident_buckets == () and 19 not in split.streamed_buckets
    assert split.share == pytest.approx(0.25, abs=0.03)
    # room for everything: kept, up to the share
    assert _plan([2**20] * 20, asked=0.25).resident_buckets == (15, 16, 17, 18, 19)


def test_a_share_outside_zero_to_one_is_refused():
    with pytest.raises(BudgetError, match=r"gpu_share: 1\.5 is not between 0 and 1"):
        HostOptimizerOffload(gpu_share=1.5)


def test_an_unknown_host_kernel_is_refused_naming_the_kernels():
    with pytest.raises(BudgetError, match=r"host_kernel: 'avx' is not one of native, torch"):
        HostOptimizerOffload(host_kernel="avx")


# -- where the host optimizer's threads run --------------------------------------------------
def _topology(tmp_path, monkeypatch, siblings):
    """The kernel's topology files for CPUs with these hyperthread ``siblings`` lists."""
    for cpu, text in siblings.items():
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    monkeypatch.setattr(cores, "_SIBLINGS", str(tmp_path / "cpu{}/topology/thread_siblings_list"))


def test_the_optimizer_leaves_the_first_cores_and_their_siblings_to_launches(
        tmp_path, monkeypatch):
    _topology(tmp_path, monkeypatch, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    assert cores.optimizer_cpus(allowed=set(range(16))) == [*range(2, 8), *range(10, 16)]
    assert cores.optimizer_cpus(4, allowed=set(range(16))) == [2, 3, 4, 5]
    # a Slurm step of CPUs 4-7 and their siblings: 4 and 5 (with 12 and 13) launch
    assert cores.optimizer_cpus(allowed={4, 5, 6, 7, 12, 13, 14, 15}) == [6, 7, 14, 15]
    # more threads than CPUs left: the job's first CPUs; a single CPU: that one
    assert cores.optimizer_cpus(13, allowed=set(range(16))) == list(range(13))
    assert cores.optimizer_cpus(allowed={3}) == [3]


def test_the_worker_thread_runs_on_its_cpus():
    cpus = sorted(os.sched_getaffinity(0))[:1]
    worker = Worker(None, [], CpuTransport(), threads=1, cpus=cpus)
    try:
        seen = worker._pool.submit(os.sched_getaffinity, 0).result()
    finally:
        worker.close()
    assert seen == set(cpus)
    assert os.sched_getaffinity(0) != set(cpus) or len(os.sched_getaffinity(0)) == 1


def test_the_steps_go_probe_measure_steady_and_the_plan_comes_between():
    phases = [Phase.of(step, PLAN_AFTER).value for step in range(1, PLAN_AFTER + 3)]
    assert phases == ["probe", *["measure"] * (PLAN_AFTER - 1), "steady", "steady"]
    *_, engine = _train({"gpu_share": 1.0}, steps=PLAN_AFTER - 1)
    assert engine.split is None and engine.stats()["phase"] == "measure"
    engine.close()
    *_, engine = _train({"gpu_share": 1.0}, steps=PLAN_AFTER)
    assert engine.split is not None and engine.stats()["phase"] == "steady"
    engine.close()


# -- the delayed update --------------------------------------------------------------------
def _delayed_reference(steps, lr_at, undelayed=frozenset()):
    """``_train``'s run with a plain AdamW on separate masters, delayed as ZeRO-Offload's
    update from the steady phase on: each step's gradient is taken at weights one update
    behind the masters; the parameters at positions in ``undelayed`` are never delayed.
    The losses, the masters and the weights the model holds."""
    torch.manual_seed(0)
    model = Net()
    trained = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().clone() for p in trained]
    optimizer = torch.optim.AdamW(masters, lr=1e-3, fused=True)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        if step == lr_at:
            optimizer.param_groups[0]["lr"] *= 0.1
        loss = model(torch.randint(VOCAB, (256,), generator=generator))
        loss.backward()
        losses.append(loss.item())
        delayed = Phase.of(step + 1, PLAN_AFTER) is Phase.STEADY
        for position, (param, master) in enumerate(zip(trained, masters, strict=True)):
            master.grad, param.grad = param.grad, None
            if delayed and position not in undelayed:
                param.data.copy_(master)  # the update before this step's
        optimizer.step()
        for position, (param, master) in enumerate(zip(trained, masters, strict=True)):
            if not delayed or position in undelayed:
                param.data.copy_(master)
    return losses, masters, trained


def test_the_delayed_update_steps_on_weights_one_update_behind():
    steps = {"steps": PLAN_AFTER + 4, "lr_at": PLAN_AFTER + 2}  # a schedule reaches it too
    reference, masters, held = _delayed_reference(**steps)
    undelayed, *_ = _train({"gpu_share": 0}, **steps)
    ours, model, _, engine = _train({"gpu_share": 0, "delayed_update": True}, **steps)
    _agree(ours, reference, 1e-5)
    assert ours[: PLAN_AFTER + 1] == pytest.approx(undelayed[: PLAN_AFTER + 1], rel=1e-5)
    assert max(abs(a - b) / b for a, b in zip(ours, undelayed, strict=True)) > 1e-4
    stats = engine.stats()
    assert stats["delayed_update"] and stats["phase"] == "steady"
    assert stats["cpu_optimizer_ms"] > 0
    trained = [p for p in model.parameters() if p.requires_grad]
    for mine, theirs, master in zip(trained, held, masters, strict=True):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-7)
        assert not torch.allclose(mine.detach(), master, rtol=1e-6, atol=0)  # one behind
    weights = [w for w, p in zip(_close(engine, model), model.parameters(), strict=True)
               if p.requires_grad]
    for mine, theirs in zip(weights, masters, strict=True):  # close brings the masters
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_buckets_the_gpu_steps_are_not_delayed():
    steps = {"steps": PLAN_AFTER + 3, "lr_at": None}
    ours, model, _, engine = _train({"gpu_share": 0.5, "delayed_update": True},
                                    budget=_streaming_budget(), **steps)
    split = engine.stats()["split"]
    assert split["streamed_buckets"] and 0 < split["share"] < 1, split
    on_gpu = {id(p) for i in (*split["streamed_buckets"], *split["resident_buckets"])
              for p in engine.buckets[i].params}
    trained = [p for p in model.parameters() if p.requires_grad]
    undelayed = frozenset(i for i, p in enumerate(trained) if id(p) in on_gpu)
    reference, masters, held = _delayed_reference(**steps, undelayed=undelayed)
    _agree(ours, reference, 1e-5)
    for position, (mine, theirs) in enumerate(zip(trained, held, strict=True)):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-7)
        behind = not torch.allclose(theirs.detach(), masters[position], rtol=1e-6, atol=0)
        assert behind == (position not in undelayed)
    engine.close()


def test_the_delayed_update_is_refused_with_the_streamed_strategy():
    with pytest.raises(BudgetError, match="delayed_update: True applies to strategy "
                                          "host_optimizer only"):
        offload_named("streamed", delayed_update=True)
    model = Net()  # asking for it asks for the host optimizer, which refuses Adagrad
    with pytest.raises(BudgetError, match="Adagrad"):
        make_strategy(model, torch.optim.Adagrad(model.parameters()),
                      offload=offload_named(None, delayed_update=True),
                      transport=CpuTransport(), budget=BUDGET,
                      priority=("params", "activations", "inputs"),
                      device_scope=contextlib.nullcontext)


#: one host optimizer set up on the CPU transport; its record of where its host memory is
PLACED = """
import json, sys, contextlib
sys.path.insert(0, "tests")
from um_functions import Net, make_optimizer
from hpcmem.um.budget import CpuTransport, HostOptimizerOffload
from hpcmem.um.host_optimizer import HostOptimizer
model = Net()
engine = HostOptimizer(model, make_optimizer(model), transport=CpuTransport(), budget=2**30,
                       offload=HostOptimizerOffload(host_memory=sys.argv[1] or None),
                       device_scope=contextlib.nullcontext)
print(json.dumps(engine.stats()["host_memory"]))
engine.close()
"""


@pytest.mark.parametrize(("declared", "asked", "kind", "fraction"), [
    ("", "", "torch", None),  # no HBM: PyTorch's allocator, pages where first written
    ("0", "", "hbw_preferred", 1.0),  # HBM declared on node 0: preferred there, unasked
    ("0", "hbw", "hbw", 1.0),
])
def test_host_memory_comes_from_the_kind_and_says_where_its_pages_are(
        declared, asked, kind, fraction):
    """In a process of its own: the placement backend binds to the nodes once a process."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "HPCMEM_HBW_NODES": declared, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PLACED, asked], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    placed = json.loads(done.stdout.splitlines()[-1])
    assert placed["kind"] == kind and placed["gpu_numa_node"] is None
    assert placed["pages"] > 0 and placed["untouched"] == 0
    assert sum(placed["nodes"].values()) == placed["pages"]
    assert placed["hbw_fraction"] == fraction


def test_a_host_memory_kind_that_cannot_allocate_is_refused_naming_it():
    model = Net()
    with pytest.raises(BudgetError, match="offload host_memory: 'hbw' cannot allocate here: "):
        HostOptimizer(model, make_optimizer(model), transport=CpuTransport(), budget=BUDGET,
                      offload=HostOptimizerOffload(host_memory="hbw"),
                      device_scope=contextlib.nullcontext)
    with pytest.raises(BudgetError, match="offload host_memory: 'numa3' is not one of torch"):
        HostOptimizerOffload(host_memory="numa3")
