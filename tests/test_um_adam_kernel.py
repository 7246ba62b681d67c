"""hpcmem's native Adam kernel (hpcmem._optim through hpcmem.um.host_optimizer.kernel): agrees
with torch.optim within fp32 rounding, gives the same bits on every instruction set and
thread count, rounds bf16 as PyTorch does, and refuses what it cannot step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpcmem.um.errors import BudgetError  # noqa: E402
from hpcmem.um.host_optimizer.kernel import (  # noqa: E402
    NativeAdam,
    TorchFused,
    bucket_kernel,
    native_refusal,
)

optim_native = pytest.importorskip("hpcmem._optim")
ISAS = optim_native.instruction_sets()
NUMEL = 100_003  # not a multiple of any vector width or of the threads' parts


def _data(numel=NUMEL, seed=0):
    generator = torch.Generator().manual_seed(seed)
    master = torch.randn(numel, generator=generator)
    grads = [torch.randn(numel, generator=generator) * 10**-k for k in range(4)]
    return master, grads


def _native_run(kind=torch.optim.AdamW, dtype=torch.bfloat16, threads=2, isa=None,
                steps=4, **options):
    master, grads = _data()
    step = kind([master], lr=1e-2, fused=True, **options)
    kernel = NativeAdam(dtype, threads=threads, isa=isa)
    out = None if kernel.out_dtype is None else torch.empty(NUMEL, dtype=dtype)
    for index in range(steps):
        kernel.step(step, master, grads[index % len(grads)].to(dtype), out)
    return master, step.state[master], out


@pytest.mark.parametrize(("kind", "options"), [
    (torch.optim.AdamW, {"weight_decay": 0.1}),
    (torch.optim.Adam, {"weight_decay": 0.1}),
    (torch.optim.AdamW, {"maximize": True, "betas": (0.8, 0.95), "eps": 1e-6}),
])
def test_fp32_steps_agree_with_torch_optim(kind, options):
    ours, state, _ = _native_run(kind, torch.float32, steps=6, **options)
    master, grads = _data()
    master.grad = torch.empty_like(master)
    reference = kind([master], lr=1e-2, foreach=False, **options)
    for index in range(6):
        master.grad.copy_(grads[index % len(grads)])
        reference.step()
    expected = reference.state[master]
    torch.testing.assert_close(ours, master, rtol=1e-6, atol=1e-7)
    # near zero, the moments differ by rounding at the gradients' scale (PyTorch fuses some
    # multiply-adds)
    torch.testing.assert_close(state["exp_avg"], expected["exp_avg"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(state["exp_avg_sq"], expected["exp_avg_sq"], rtol=1e-5,
                               atol=1e-12)
    assert float(state["step"]) == float(expected["step"]) == 6


def test_every_instruction_set_and_thread_count_gives_the_same_bits():
    assert ISAS[-1] == "baseline"
    runs = [_native_run(isa=isa, threads=threads) for isa in ISAS for threads in (1, 3)]
    first_master, first_state, first_out = runs[0]
    for master, state, out in runs[1:]:
        assert torch.equal(master, first_master)
        assert torch.equal(state["exp_avg_sq"], first_state["exp_avg_sq"])
        assert torch.equal(out.view(torch.int16), first_out.view(torch.int16))


def test_the_weights_written_are_the_master_rounded_as_pytorch_rounds():
    master, _, out = _native_run()
    assert torch.equal(out.view(torch.int16), master.to(torch.bfloat16).view(torch.int16))
    # ties to even, the largest finite values, subnormals, signed zero, infinities, NaN
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F7FFF,
                         0x00000001, 0x00408000, 0x80000000, 0x7F800000, 0xFF800000,
                         0x7FC00001, 0xFFA00000], dtype=torch.int64).to(torch.int32)
    special = bits.view(torch.float32).clone()
    step = torch.optim.AdamW([special], lr=0.0, weight_decay=0.0, fused=True)
    kernel = NativeAdam(torch.bfloat16, threads=1)
    written = torch.empty(special.numel(), dtype=torch.bfloat16)
    kernel.step(step, special, torch.zeros_like(written), written)  # lr 0: the master stays
    expected = special.to(torch.bfloat16)
    assert torch.equal(torch.isnan(written), torch.isnan(expected))  # PyTorch's NaN bits vary
    number = ~torch.isnan(expected)
    assert torch.equal(written[number].view(torch.int16), expected[number].view(torch.int16))


def test_threads_bound_to_cpus_step_as_unbound_ones_do():
    cpus = sorted(__import__("os").sched_getaffinity(0))
    master, grads = _data(4096)
    results = []
    for bound in (None, cpus):
        copy = master.clone()
        step = torch.optim.AdamW([copy], lr=1e-3, fused=True)
        NativeAdam(torch.float32, threads=len(cpus) + 1, cpus=bound).step(
            step, copy, grads[0], None)
        results.append(copy)
    assert torch.equal(*results)


def test_buffers_the_kernel_cannot_read_are_refused_naming_them():
    master = torch.zeros(64)
    step = torch.optim.AdamW([master], lr=1e-3, fused=True)
    kernel = NativeAdam(torch.bfloat16, threads=1)
    out = torch.empty(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"grad is .*float32.*wanted a contiguous CPU tensor "
                                         r"of 64 torch\.bfloat16"):
        kernel.step(step, master, torch.zeros(64), out)
    with pytest.raises(ValueError, match=r"out is .*wanted"):
        kernel.step(step, master, torch.zeros(64, dtype=torch.bfloat16), out[::2])
    with pytest.raises(ValueError, match="instruction set 'sse9'"):
        NativeAdam(torch.bfloat16, threads=1, isa="sse9").step(
            step, master, torch.zeros(64, dtype=torch.bfloat16), out)


@pytest.mark.parametrize(("make", "dtype", "reason"), [
    (lambda p: torch.optim.SGD(p, lr=0.1), torch.bfloat16, "SGD is not Adam or AdamW"),
    (lambda p: torch.optim.AdamW(p, amsgrad=True), torch.bfloat16, "sets amsgrad"),
    (lambda p: torch.optim.Adam(p), torch.float16, "working dtype torch.float16"),
])
def test_what_the_native_kernel_cannot_step_goes_to_pytorch_saying_why(make, dtype, reason):
    optimizer = make([torch.nn.Parameter(torch.zeros(4))])
    assert reason in native_refusal(optimizer, dtype)
    assert isinstance(bucket_kernel(optimizer, dtype, threads=1), TorchFused)
    with pytest.raises(BudgetError, match=f"'native' cannot step this job: .*{reason}"):
        bucket_kernel(optimizer, dtype, threads=1, kind="native")
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    assert bucket_kernel(adam, torch.bfloat16, threads=1).name == f"hpcmem-{ISAS[0]}"
    assert bucket_kernel(adam, torch.bfloat16, threads=1, kind="native").name.startswith("hpcmem")
    assert isinstance(bucket_kernel(adam, torch.bfloat16, threads=1, kind="torch"), TorchFused)


# -- moments kept in bf16 (Offload(state_dtype="bfloat16")) ------------------------------------
def _bf16_state_run(steps, isa=None, threads=2):
    master, grads = _data()
    step = torch.optim.AdamW([master], lr=1e-2, fused=True)
    kernel = NativeAdam(torch.bfloat16, threads=threads, isa=isa, state_dtype=torch.bfloat16)
    kernel.attach(master, None)
    out = torch.empty(NUMEL, dtype=torch.bfloat16)
    for index in range(steps):
        kernel.step(step, master, grads[index % len(grads)].to(torch.bfloat16), out)
    return master, step.state[master], out


def test_bf16_moments_stay_unbiased_where_rounding_to_nearest_drifts():
    steps = 400
    _, state, _ = _bf16_state_run(steps)
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    _, grads = _data()
    m = v = near = torch.zeros(NUMEL)
    for index in range(steps):  # fp32 moments, and the second rounded to nearest each step
        g = grads[index % len(grads)].to(torch.bfloat16).float()
        m = m + 0.1 * (g - m)
        v = 0.999 * v + 0.001 * g * g
        near = (0.999 * near + 0.001 * g * g).to(torch.bfloat16).float()
    drift = float(near.mean() / v.mean() - 1)
    ours = float(state["exp_avg_sq"].float().mean() / v.mean() - 1)
    assert abs(drift) > 5e-3  # rounded to nearest, updates below half a bf16 step are lost
    assert abs(ours) < 1e-3, (ours, drift)
    assert abs(float(state["exp_avg"].float().mean() / m.mean() - 1)) < 1e-2
    # elementwise the rounding noise is a random walk of steps below a bf16 step each
    assert float((state["exp_avg_sq"].float() - v).norm() / v.norm()) < 0.04


def test_bf16_moments_give_the_same_bits_everywhere_and_weights_close_to_fp32_moments():
    runs = [_bf16_state_run(6, isa=isa, threads=threads) for isa in ISAS for threads in (1, 3)]
    first_master, first_state, _ = runs[0]
    for master, state, _ in runs[1:]:
        assert torch.equal(master, first_master)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key].view(torch.int16), first_state[key].view(torch.int16))
    wide, *_ = _native_run(steps=6)
    start, _ = _data()
    moved = (wide - start).norm()
    assert float((first_master - wide).norm() / moved) < 1e-2


def test_moments_in_bf16_need_the_native_kernel():
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    kernel = bucket_kernel(adam, torch.bfloat16, threads=1, state_dtype=torch.bfloat16)
    assert kernel.state_dtype == torch.bfloat16
    with pytest.raises(BudgetError, match="state_dtype: 'bfloat16' needs host_kernel 'native'"):
        bucket_kernel(adam, torch.bfloat16, threads=1, kind="torch", state_dtype=torch.bfloat16)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    with pytest.raises(BudgetError, match="needs the native kernel, which cannot step this "
                                          "job: SGD is not Adam or AdamW"):
        bucket_kernel(sgd, torch.bfloat16, threads=1, state_dtype=torch.bfloat16)
