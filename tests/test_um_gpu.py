"""Unified Memory on a real GPU: advice read back from the driver, routing, losses, budget,
guard, leaks. Marked ``gpu``: skipped without CUDA, run by benchmarks/gpu/run.sh on the H200."""

from __future__ import annotations

import gc
import os

import pytest

# Deterministic cuBLAS for the bit-for-bit loss comparison; must precede the first handle.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

pytestmark = pytest.mark.gpu

TYPES = ("params", "activations", "inputs")
MiB = 2**20


@pytest.fixture(scope="module")
def um_native():
    return pytest.importorskip("hpcmem._um")


_OPENED: list = []


@pytest.fixture(autouse=True)
def _close_every_unified_memory():
    """A failed test must not leave its UnifiedMemory open for the next one."""
    yield
    while _OPENED:
        _OPENED.pop().close()
    gc.collect()


def _model(torch, width=256, hidden=1024, layers=3):
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width)]
    return torch.nn.Sequential(*blocks, torch.nn.LayerNorm(width))


def _train(torch, policy, steps, *, seed=0, bf16=False, budget=None, batch=64, offload=None,
           **model_kw):
    """A tiny training run; returns (um, model, optimizer, losses). Caller closes ``um``."""
    from hpcmem.um import UnifiedMemory

    torch.manual_seed(seed)
    um = UnifiedMemory(policy, device=0, gpu_budget=budget)
    _OPENED.append(um)
    with um.params():
        model = _model(torch, **model_kw).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    um.attach(model, optimizer, offload=offload)
    width = model[0].in_features
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = um.stage(torch.randn(batch, width, generator=generator))
        y = um.stage(torch.randn(batch, width, generator=generator))
        with um.activations():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        losses.append(loss.item())
    return um, model, optimizer, losses


def _more_steps(torch, um, model, optimizer, steps, *, seed):
    """``steps`` more steps of a :func:`_train` model on new random batches, then a sync."""
    width = model[0].in_features
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = um.stage(torch.randn(64, width, generator=generator))
        with um.activations():
            model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    torch.cuda.synchronize()


def _owner(um, ptr):
    """The type whose live segment holds ``ptr``, or None."""
    for name in TYPES:
        for start, size, _on_gpu in um.segments(name):
            if start <= ptr < start + size:
                return name
    return None


def _free(torch, um):
    """Close ``um``; the caller has dropped its tensors, so the pools can give memory back."""
    um.close()
    if um in _OPENED:
        _OPENED.remove(um)
    del um
    gc.collect()
    torch.cuda.empty_cache()


def _losses(torch, policy, steps, **kw):
    um, model, optimizer, losses = _train(torch, policy, steps, **kw)
    del model, optimizer
    _free(torch, um)
    return losses


def test_each_type_gets_exactly_the_advice_its_policy_asks_for(torch, um_native, tmp_path):
    policy = tmp_path / "mixed.yaml"
    policy.write_text(
        "params: {preferred_location: gpu, accessed_by: [gpu], prefetch: on_alloc}\n"
        "activations: {preferred_location: none, read_mostly: true}\n"
        "inputs: {preferred_location: cpu, accessed_by: [gpu, cpu], prefetch: on_alloc}\n"
    )
    um, model, optimizer, _ = _train(torch, policy, 2)
    torch.cuda.synchronize()
    dev, cpu, none = 0, um_native.CPU_ID, um_native.INVALID_ID
    expected = {
        "params": (dev, [dev], False, dev),
        "activations": (none, [], True, none),
        "inputs": (cpu, [dev, cpu], False, cpu),
    }
    for name in TYPES:
        segments = um.segments(name)
        assert segments, f"no {name} segments"
        for start, size, _ in segments:
            attrs = um_native.range_attributes(start, size)
            got = (
                attrs["preferred_location"],
                sorted(attrs["accessed_by"]),
                attrs["read_mostly"],
                attrs["last_prefetch_location"],
            )
            want = expected[name]
            assert got == (want[0], sorted(want[1]), want[2], want[3]), (name, start, size)
            assert um_native.is_managed(start)
    stats = um.stats()
    assert stats["params"]["advice_calls"] >= 2 * stats["params"]["segments"]
    assert stats["activations"]["prefetched_bytes"] == 0
    del model, optimizer
    _free(torch, um)


def test_a_training_step_allocates_nothing_outside_the_three_pools(torch, um_native):
    um, model, optimizer, _ = _train(torch, "hpcmem", 2)
    um.reset_stats()
    _more_steps(torch, um, model, optimizer, 3, seed=1)
    stats = um.stats()
    assert stats["escaped_bytes"] == 0, stats
    assert stats["managed_bytes"] == sum(stats[t]["live_bytes"] for t in TYPES)
    for param in model.parameters():
        assert _owner(um, param.data_ptr()) == "params"
        assert _owner(um, param.grad.data_ptr()) == "params"
    for state in optimizer.state.values():
        for value in state.values():
            if value.is_cuda:
                assert _owner(um, value.data_ptr()) == "params"
    assert stats["activations"]["peak_bytes"] > 0 and stats["inputs"]["peak_bytes"] > 0
    del model, optimizer
    _free(torch, um)


@pytest.mark.parametrize("policy", ["um", "hpcmem"])
def test_fp32_losses_match_the_cuda_preset_bit_for_bit(torch, policy):
    torch.use_deterministic_algorithms(True)
    try:
        reference = _losses(torch, "cuda", 8)
        losses = _losses(torch, policy, 8)
    finally:
        torch.use_deterministic_algorithms(False)
    assert losses == reference


def test_bf16_losses_match_the_cuda_preset_within_tolerance(torch):
    reference = _losses(torch, "cuda", 8, bf16=True)
    losses = _losses(torch, "hpcmem", 8, bf16=True)
    assert losses == pytest.approx(reference, rel=2e-2)


def test_before_use_hooks_prefetch_params_and_keep_losses(torch, um_native, tmp_path):
    policy = tmp_path / "ahead.yaml"
    policy.write_text(
        "params: {preferred_location: gpu, accessed_by: [gpu], prefetch: before_use}\n"
        "inputs: {preferred_location: cpu, accessed_by: [gpu], prefetch: before_use}\n"
    )
    torch.use_deterministic_algorithms(True)
    try:
        reference = _losses(torch, "cuda", 4)
        um, model, optimizer, losses = _train(torch, policy, 4)
    finally:
        torch.use_deterministic_algorithms(False)
    stats = um.stats()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert stats["params"]["prefetched_bytes"] >= 4 * param_bytes  # forward + backward, 4 steps
    assert losses == reference
    del model, optimizer
    _free(torch, um)


def test_budget_streams_the_model_from_host_memory(torch, um_native):
    # params+grads+AdamW of this model: 4 x 6 x 4 MiB; segments of 4 MiB tensors are 20 MiB
    from hpcmem.um.budget.offload import StreamedOffload

    budget = 64 * MiB
    um, model, optimizer, losses = _train(torch, "hpcmem", 4, budget=budget, hidden=4096,
                                          offload=StreamedOffload())
    torch.cuda.synchronize()
    stats = um.stats()
    assert stats["params"]["gpu_bytes"] == 0  # the params pool is host memory under a budget
    assert 0 < stats["peak_gpu_resident_bytes"] <= budget
    big = [p for p in model.parameters() if p.numel() * p.element_size() >= MiB]
    assert big and all(p.device.type == "cpu" and p.is_pinned() for p in big)
    stream = stats["offload"]
    assert stream["bytes_h2d"] >= sum(p.numel() * 4 for p in big)  # fetched at least once
    assert stream["plan"] is not None
    assert all(loss == loss for loss in losses)  # finite, no NaN
    del model, optimizer
    _free(torch, um)


def test_a_renewed_activations_pool_gives_its_cached_segments_back(torch, um_native):
    """What a budget strategy handed over leaves cached in the activations pool goes back to
    the device, and the routing goes on into the new pool."""
    from hpcmem.um import UnifiedMemory

    um = UnifiedMemory("hpcmem", device=0)
    _OPENED.append(um)
    with um.activations():
        block = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        assert _owner(um, block.data_ptr()) == "activations"
        del block
        cached = torch.cuda.memory_reserved(0)
        um._renew_activations()
        assert torch.cuda.memory_reserved(0) <= cached - 64 * MiB
        after = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        assert _owner(um, after.data_ptr()) == "activations"
        del after
    _free(torch, um)


def test_guard_refuses_an_oversized_request_without_allocating(torch, um_native):
    from hpcmem.um import OversubscriptionError, UnifiedMemory

    free, _ = torch.cuda.mem_get_info(0)
    um = UnifiedMemory("hpcmem", device=0, headroom_bytes=free - 64 * MiB)
    _OPENED.append(um)
    assert um.limit_bytes <= 64 * MiB
    before = um_native.managed_bytes()
    with pytest.raises(OversubscriptionError) as error, um.activations():
        torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    assert isinstance(error.value, torch.OutOfMemoryError)
    assert "oversubscription guard: refused" in str(error.value)
    assert um_native.managed_bytes() == before
    assert um.stats()["activations"]["refusals"] >= 1
    with pytest.raises(OversubscriptionError):
        um.check_request(128 * MiB)
    with um.activations():  # small requests still fit under the limit
        small = torch.ones(MiB, device="cuda")
    assert small.sum().item() == MiB
    del small
    _free(torch, um)


def test_nothing_leaks_over_200_steps(torch, um_native):
    um, model, optimizer, _ = _train(torch, "hpcmem", 10, width=128, hidden=256)
    warm = {t: um.stats()[t]["live_bytes"] for t in TYPES}
    segments = {t: len(um.segments(t)) for t in TYPES}
    _more_steps(torch, um, model, optimizer, 200, seed=2)
    assert {t: um.stats()[t]["live_bytes"] for t in TYPES} == warm
    assert {t: len(um.segments(t)) for t in TYPES} == segments
    ours = {ptr for t in TYPES for ptr, _, _ in um.segments(t)}
    _OPENED.remove(um)
    um.close()
    del model, optimizer, um
    gc.collect()
    torch.cuda.empty_cache()
    # Released with the job, except blocks PyTorch caches for the whole process (cuBLAS and
    # cuBLASLt workspaces per handle and stream), at most one 32 MiB workspace.
    alive = [
        (index, size)
        for index in range(len(TYPES))
        for ptr, size, _, _ in um_native.segments(index)
        if ptr in ours
    ]
    assert sum(size for _, size in alive) <= 32 * MiB, alive
