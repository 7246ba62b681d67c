"""The training loop's parts: step statistics and eagerly created AdamW state."""

from __future__ import annotations

import pytest

from hpcmem.train.loop import StepStats, TrainResult, materialize_optimizer_state, step_stats

torch = pytest.importorskip("torch")


def test_step_stats_are_median_and_inclusive_deciles() -> None:
    times = [float(x) for x in range(1, 12)]  # 1..11 ms
    assert step_stats(times) == StepStats(median=6.0, p10=2.0, p90=10.0)


def test_step_stats_of_one_step_and_of_none() -> None:
    assert step_stats([4.5]) == StepStats(4.5, 4.5, 4.5)
    with pytest.raises(ValueError, match="no timed steps"):
        step_stats([])


def test_result_separates_first_step_and_warmup_from_the_statistics() -> None:
    result = TrainResult(step_ms=[900.0, 50.0, 10.0, 12.0, 11.0], warmup=2,
                         losses=[5.0, 4.0, 3.0, 2.0, 1.0], items_per_step=1000,
                         memory={}, peak_reserved_bytes=None)
    assert result.first_step_ms == 900.0
    assert result.timed == step_stats([10.0, 12.0, 11.0])
    assert result.throughput() == pytest.approx(1000 / 0.011)
    assert result.loss_ends() == {"first": [5.0, 4.0, 3.0, 2.0, 1.0],
                                  "last": [5.0, 4.0, 3.0, 2.0, 1.0]}


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_adamw_state_is_created_up_front_without_moving_the_weights(fused: bool) -> None:
    model = torch.nn.Linear(8, 4)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    materialize_optimizer_state(optimizer)
    assert optimizer.param_groups[0]["lr"] == 0.1
    for parameter, original in zip(model.parameters(), before, strict=True):
        assert torch.equal(parameter, original)
        state = optimizer.state[parameter]
        assert state["step"].item() == 0
        assert torch.count_nonzero(state["exp_avg"]) == 0
        assert torch.count_nonzero(state["exp_avg_sq"]) == 0
    # The first real step behaves exactly like a fresh optimizer's first step.
    fresh = torch.nn.Linear(8, 4)
    fresh.load_state_dict(model.state_dict())
    reference = torch.optim.AdamW(fresh.parameters(), lr=0.1, fused=fused)
    for net, opt in ((model, optimizer), (fresh, reference)):
        net(torch.ones(2, 8)).sum().backward()
        opt.step()
    for mine, theirs in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(mine, theirs)
