"""Checkpoints under the host optimizer (hpcmem.um.host_optimizer.checkpoint), on the CPU
transport: ``model.state_dict()`` and ``optimizer.state_dict()`` hold the fp32 masters and
moments, as without a budget, and a run resumed from them, loaded after ``attach`` or before
it, continues the uninterrupted run's losses. Several ranks: ``tests/test_um_data_parallel.py``.

Tolerance: the resumed run restores every master, moment and step exactly, so its losses
are the uninterrupted run's to 1e-6 relative (fp32 working weights).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cpu_memory import CpuMemory  # noqa: E402
from um_functions import tiny_qwen2  # noqa: E402

from hpcmem.um.budget import HostOptimizerOffload  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 2**30
STEPS = 4


def _optimizer(model):
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=1e-3)


def _batches():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(512, (3, 16), generator=generator) for _ in range(STEPS)]


def _steps(model, optimizer, memory, batches):
    losses = []
    for tokens in batches:
        with memory.activations():
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_the_state_dicts_hold_the_fp32_masters_and_moments():
    model = tiny_qwen2()
    optimizer = _optimizer(model)
    memory = CpuMemory(gpu_budget=BUDGET)
    memory.attach(model, optimizer, offload=HostOptimizerOffload(working_dtype="bfloat16"))
    _steps(model, optimizer, memory, _batches()[:2])
    weights = model.state_dict()
    state = optimizer.state_dict()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # still attached
    assert optimizer.state == {}  # the host holds it
    memory.close()  # gives the masters and moments back: what the state dicts said
    for name, value in model.state_dict().items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], value), name
    plain = optimizer.state_dict()
    assert sorted(state["state"]) == sorted(plain["state"]) == list(range(len(
        list(model.parameters()))))
    for index, values in plain["state"].items():
        for key, value in values.items():
            assert torch.equal(state["state"][index][key], value), (index, key)
            assert state["state"][index][key].dtype == torch.float32
    assert state["param_groups"] == plain["param_groups"]


@pytest.mark.parametrize("load", ["after_attach", "before_attach"])
def test_a_resumed_run_continues_the_uninterrupted_losses(load, tmp_path):
    batches = _batches()
    model = tiny_qwen2()
    optimizer = _optimizer(model)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, optimizer, offload=HostOptimizerOffload())
        whole = _steps(model, optimizer, memory, batches)

    model = tiny_qwen2()
    optimizer = _optimizer(model)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, optimizer, offload=HostOptimizerOffload())
        first = _steps(model, optimizer, memory, batches[:2])
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   tmp_path / "checkpoint.pt")
    saved = torch.load(tmp_path / "checkpoint.pt")

    model = tiny_qwen2()  # another start: only the checkpoint carries the first steps
    optimizer = _optimizer(model)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        if load == "before_attach":
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        memory.attach(model, optimizer, offload=HostOptimizerOffload())
        if load == "after_attach":
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            assert optimizer.state == {}
        rest = _steps(model, optimizer, memory, batches[2:])
    assert first + rest == pytest.approx(whole, rel=1e-6)
