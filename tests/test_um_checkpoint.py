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

from hpcmem.um import BudgetError  # noqa: E402
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


def _another_model():
    """A Qwen2 of another width: every matrix and moment of another shape."""
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=512, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        use_cache=False))


def _snapshot(model, optimizer):
    """Clones of what the state dicts hold now."""
    state = optimizer.state_dict()["state"]
    return ({name: value.clone() for name, value in model.state_dict().items()},
            {i: {k: v.clone() for k, v in values.items()} for i, values in state.items()})


@pytest.mark.parametrize("what", ["shape", "missing", "unexpected", "groups", "moments"])
def test_a_checkpoint_of_another_model_is_refused_in_one_line_and_nothing_is_loaded(what):
    other = _another_model()
    other_optimizer = _optimizer(other)
    _steps(other, other_optimizer, CpuMemory(), _batches()[:1])  # its moments made
    model = tiny_qwen2()
    optimizer = _optimizer(model)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, optimizer, offload=HostOptimizerOffload())
        _steps(model, optimizer, memory, _batches()[:1])
        before = _snapshot(model, optimizer)
        weights = {k: v.clone() for k, v in before[0].items()}
        state = optimizer.state_dict()
        if what == "shape":
            load, said = (lambda: model.load_state_dict(other.state_dict()),
                          r"'model\.[\w.]+' is \(.*48.*\) in the checkpoint, not the model's "
                          r"\(.*32.*\)")
        elif what in ("missing", "unexpected"):
            if what == "missing":
                del weights["model.norm.weight"]
            else:
                weights["model.extra.weight"] = torch.zeros(1)
            word = "missing from" if what == "missing" else "not the model's but in"
            load, said = (lambda: model.load_state_dict(weights),
                          f"'model.{'norm' if what == 'missing' else 'extra'}.weight' {word}")
        elif what == "groups":
            state["param_groups"] = state["param_groups"][:1]
            load, said = (lambda: optimizer.load_state_dict(state),
                          r"param groups of \[\d+\] parameters in the checkpoint, not the "
                          r"optimizer's \[\d+, \d+\]")
        else:
            load, said = (lambda: optimizer.load_state_dict(other_optimizer.state_dict()),
                          r"state 'exp_avg' is \(\d+, 48\) in the checkpoint")
        with pytest.raises(BudgetError, match=said) as caught:
            load()
        assert "\n" not in str(caught.value) and "nothing was loaded" in str(caught.value)
        after = _snapshot(model, optimizer)
    for was, now in zip(before, after, strict=True):
        assert was.keys() == now.keys()
        for key in was:
            values = (was[key], now[key]) if torch.is_tensor(was[key]) else None
            if values:
                assert torch.equal(*values), key
            else:
                for name in was[key]:
                    assert torch.equal(was[key][name], now[key][name]), (key, name)
