"""A budget the planned strategy's probe refuses goes to the other strategy (hpcmem.um.strategy
``Planned``), on the CPU transport: the job trains as without a budget (the probe's
gradients carried over, nothing stepped twice), the record names the refusal, and where the
other refuses too, or host memory cannot hold its homes, one error says so.

The host optimizer keeps every working weight on the device, the streamed strategy one
layer's: a budget between their floors is refused by the first and met by the second. The
streamed strategy's probe also steps the optimizer chunk by chunk, which holds more than its
forward and backward: in bf16 the host optimizer's floor lies between the two, so that
strategy takes over after the first step. Tolerances: fp32 on the CPU, the same operations
in the same order, so losses agree to 1e-6 relative and weights to 1e-6 absolute; bf16
working weights, 1e-3 relative.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

torch = pytest.importorskip("torch")

from um_functions import VOCAB, Net, make_optimizer  # noqa: E402

from hpcmem.um.budget import BudgetTooSmallError, CpuTransport  # noqa: E402
from hpcmem.um.budget.host_memory import available_host_bytes  # noqa: E402
from hpcmem.um.budget.offload import HostOptimizerOffload, Offload, StreamedOffload  # noqa: E402
from hpcmem.um.host_optimizer import HostOptimizer  # noqa: E402
from hpcmem.um.strategy import Planned, make_strategy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTH = 512  # the blocks' weights, 2 MiB each, are streamed one by one
BETWEEN = 8 * 2**20  # above the streamed floor (about 2 MiB), below the host optimizer's (13)
STEPS = 4


def _train(budget=None, micro=1, first=None, host_bytes=0, keep=False, bf16=False,
           released=None):
    """Losses and weights of ``STEPS`` steps of ``micro`` micro-batches; with a ``budget``,
    through a :class:`Planned` that tries ``first`` (a plain ``Offload``: the plan's choice),
    then the other strategy; a hand-over appends to ``released``."""
    torch.manual_seed(0)
    model = Net(WIDTH)
    optimizer = make_optimizer(model)
    strategy = None
    if budget is not None:
        def make(value):
            return make_strategy(model, optimizer, offload=value, transport=CpuTransport(),
                                 budget=budget, priority=("params", "activations", "inputs"),
                                 device_scope=nullcontext, release_device_cache=release)

        def release():
            released.append(strategy.current)  # the first strategy is closed by then

        if first.strategy is None:
            strategy = make(first)
        else:
            other = (StreamedOffload if isinstance(first, HostOptimizerOffload) else
                     HostOptimizerOffload)(working_dtype=first.working_dtype)
            strategy = Planned(make, first, other, host_bytes=host_bytes)
        if keep:
            strategy.keep()
    generator = torch.Generator().manual_seed(1)
    losses = []
    try:
        for _ in range(STEPS):
            for _ in range(micro):
                with strategy.scope() if strategy else nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        loss = model(torch.randint(VOCAB, (256,), generator=generator)) / micro
                    loss.backward()
                losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad()
        stats = strategy.stats() if strategy else {}
    finally:
        if strategy:
            strategy.close()
    return losses, [p.detach().clone() for p in model.parameters()], stats


@pytest.mark.parametrize("micro", [1, 2])
def test_a_budget_the_host_optimizer_refuses_trains_on_the_streamed_strategy(micro):
    reference, weights, _ = _train(micro=micro)
    losses, trained, stats = _train(BETWEEN, micro, HostOptimizerOffload())
    assert losses == pytest.approx(reference, rel=1e-6)
    for ours, theirs in zip(trained, weights, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert stats["strategy"] == "streamed"
    fallback = stats["fallback"]
    assert fallback["refused_by"] == "host_optimizer"
    assert fallback["floor_bytes"] > BETWEEN
    assert "working weights" in fallback["why"]


def test_a_budget_the_streamed_strategy_refuses_after_its_first_step_goes_on():
    reference, _, _ = _train(bf16=True)
    bf16 = "bfloat16"
    losses, _, stats = _train(7 * 2**20, first=StreamedOffload(working_dtype=bf16), bf16=True)
    assert losses == pytest.approx(reference, rel=1e-3)
    assert stats["strategy"] == "host_optimizer"
    assert stats["fallback"]["refused_by"] == "streamed"
    assert stats["fallback"]["floor_bytes"] > 7 * 2**20


@pytest.mark.parametrize("state_dtype", [None, "bfloat16"])
def test_the_plans_own_choice_hands_over(state_dtype):
    """At 7 MiB the plan picks the streamed strategy (the host optimizer's copies' buffers
    alone take 10 MiB of its fixed bytes), which then refuses after its first step; the
    other keeps the moments as the first did."""
    reference, _, _ = _train(bf16=True)
    released = []
    first = Offload(working_dtype="bfloat16", state_dtype=state_dtype)
    losses, _, stats = _train(7 * 2**20, first=first, bf16=True, released=released)
    assert losses == pytest.approx(reference, rel=1e-3)
    assert (stats["fallback"]["refused_by"], stats["strategy"]) == ("streamed", "host_optimizer")
    assert stats["state_dtype"] == (state_dtype or "float32")
    assert released == [None]  # the device cache released once, between the two


def test_a_budget_both_refuse_names_both_floors():
    with pytest.raises(BudgetTooSmallError) as refused:
        _train(2**20, first=StreamedOffload())
    message = str(refused.value)
    assert "both strategies refused it (streamed" in message and ", host_optimizer " in message
    assert refused.value.minimum > 2**20  # the lower floor: the streamed one
    assert refused.value.minimum < 8 * 2**20


def test_the_other_strategy_is_not_tried_where_host_memory_lacks_its_homes():
    available = available_host_bytes()
    assert available is not None and available > 0
    with pytest.raises(BudgetTooSmallError) as refused:
        _train(BETWEEN, first=HostOptimizerOffload(), host_bytes=available + 2**30)
    assert "strategy streamed not tried: its host homes need about" in str(refused.value)


def test_a_kept_strategy_refuses_alone():
    """A trainer that clips its gradients keeps the strategy it attached with."""
    with pytest.raises(BudgetTooSmallError) as refused:
        _train(BETWEEN, first=HostOptimizerOffload(), keep=True)
    assert "both" not in str(refused.value) and "working weights" in str(refused.value)


@pytest.mark.parametrize("offload", [
    HostOptimizerOffload(),  # sent to host memory as backward made them
    HostOptimizerOffload(micro_batches=2),  # still accumulating on the device
    HostOptimizerOffload(batch_split=2),  # a split batch, its parts summed on the device
    HostOptimizerOffload(batch_split=2, host_accumulation=True),  # summed in host memory
    HostOptimizerOffload(micro_batches=2, host_accumulation=True),  # micro-batches, there too
], ids=["sent", "accumulating", "split", "split-host-sums", "accumulating-host-sums"])
def test_a_refused_probe_gives_its_gradients_back(offload):
    """Wherever the probe's gradients were when it refused, the model comes back with them
    in ``.grad`` (fp32, host), as backward without a budget makes them (summation order
    aside: 1e-6 of the largest)."""
    pytest.importorskip("transformers")
    from cpu_memory import CpuMemory
    from um_functions import tiny_qwen2

    tokens = torch.randint(512, (5, 24), generator=torch.Generator().manual_seed(1))
    plain = tiny_qwen2()
    plain(input_ids=tokens, labels=tokens).loss.backward()
    model = tiny_qwen2()
    with pytest.raises(BudgetTooSmallError), CpuMemory(gpu_budget=1024) as memory:
        memory.attach(model, torch.optim.AdamW(model.parameters()), offload=offload)
        with memory.activations():
            model(input_ids=tokens, labels=tokens).loss.backward()
    for (name, ours), theirs in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert ours.device.type == "cpu" and ours.grad.dtype == torch.float32, name
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0,
                                   atol=1e-6 * theirs.grad.abs().max().item())


@pytest.mark.parametrize(("cgroup", "files", "left"), [
    ("4:memory:/slurm/uid_0/job_7/step_0", {"memory.limit_in_bytes": 8 << 30,
                                           "memory.usage_in_bytes": 3 << 30}, 5 << 30),
    ("0::/system.slice/slurmstepd.scope/job_7", {"memory.max": 4 << 30,
                                                 "memory.current": 1 << 30}, 3 << 30),
    ("0::/user.slice", {"memory.max": "max", "memory.current": 1 << 30}, 20 << 30),
    ("4:memory:/", {"memory.limit_in_bytes": 9223372036854771712,
                    "memory.usage_in_bytes": 1 << 30}, 20 << 30),  # v1's "no limit"
], ids=["v1-job", "v2-job", "v2-unlimited", "v1-unlimited"])
def test_host_memory_left_is_the_cgroups_where_it_sets_less(tmp_path, cgroup, files, left):
    """A Slurm job's memory cgroup, laid out as on a node (v1: one hierarchy per controller,
    v2: one for all), bounds what the other strategy's homes may take."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {64 << 20} kB\nMemAvailable: "
                                           f"{20 << 20} kB\n")
    (tmp_path / "proc/self/cgroup").write_text(f"9:pids:/\n{cgroup}\n")
    path = cgroup.split(":", 2)[2].lstrip("/")
    base = tmp_path / "sys/fs/cgroup" / ("memory" if ":memory:" in cgroup else "") / path
    base.mkdir(parents=True)
    for name, value in files.items():
        (base / name).write_text(f"{value}\n")
    assert available_host_bytes(tmp_path) == left
    assert available_host_bytes(tmp_path / "nothing") is None  # nothing readable


def test_only_a_planned_strategy_falls_back():
    model = Net()
    optimizer = make_optimizer(model)
    common = {"transport": CpuTransport(), "budget": 2**30, "device_scope": nullcontext,
              "priority": ("params", "activations", "inputs")}
    planned = make_strategy(model, optimizer, offload=Offload(), **common)
    assert isinstance(planned, Planned) and isinstance(planned.current, HostOptimizer)
    assert planned.buckets is planned.current.buckets  # the rest is the strategy's
    planned.close()
    asked = make_strategy(model, optimizer, offload=HostOptimizerOffload(), **common)
    assert isinstance(asked, HostOptimizer)
    asked.close()
    other = make_strategy(model, torch.optim.Adagrad(model.parameters()), offload=Offload(),
                          **common)  # no host optimizer for it: nothing to fall back to
    assert other.stats()["strategy"] == "streamed" and not isinstance(other, Planned)
    other.close()
