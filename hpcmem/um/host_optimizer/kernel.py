"""The CPU step of one bucket: hpcmem's native Adam kernel where it applies, PyTorch's fused
CPU kernel everywhere else.

The host side is bound by host memory bandwidth (on the H200 host, fused CPU AdamW moved
93 to 108 GB/s, ``docs/gpu-budget.md``), so what counts is the bytes each element
moves through host memory per step. With PyTorch's kernel the gradient lands in fp32 and
the fp32 master is uploaded (the casts run on the GPU): 4 bytes written by the gradient's
copy, 28 read and written by the step, 4 read by the upload, 36 in all.
:class:`NativeAdam` reads the gradient in the working dtype and writes the working weights
in it beside the master, in the same pass: with bf16 weights, 2 + 26 + 2 + 2 = 32 bytes,
and PCIe carries half the bytes each way. It computes in fp32 as PyTorch's kernel does
(not bit for bit: the order of a few operations differs; ``tests/test_um_host_optimizer.py``
bounds the difference), and gives the same bits with AVX-512, AVX2 or neither
(``native/optim``), on threads bound one per CPU.

Both keep the bucket's state in PyTorch's layout, in the state of the bucket's own
``torch.optim`` instance (``step``, ``exp_avg``, ``exp_avg_sq``), which hands it back to
the job's optimizer (in fp32).

``state_dtype="bfloat16"`` has the native kernel keep the two moments in bf16:
each element then moves 20 bytes through host memory in the step instead of 28, and its
state takes half the host memory. Both moments are rounded stochastically (up with the
probability of the dropped bits, from a counter-based hash of the element, the bucket and
the step: reproducible, the same on every instruction set and thread count), so that they
are exact on average: rounded to nearest, the second moment would stop moving, since
``1 - beta2`` of it is below half a bf16 step. The update itself is computed from the
unrounded moments, in fp32.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

from hpcmem.um.errors import BudgetError

__all__ = ["BucketKernel", "NativeAdam", "TorchFused", "bucket_kernel", "native_refusal"]

#: Working dtypes the native kernel reads gradients and writes weights in; also the dtypes
#: it keeps the moments in (``Offload.state_dtype``).
NATIVE_DTYPES = ("float32", "bfloat16")


class BucketKernel(ABC):
    """How a bucket's step runs: the dtype its gradient arrives in, the dtype of the
    weights it writes beside the master (None: it writes none, the master is uploaded),
    the dtype of its moments."""

    name: str
    grad_dtype: Any
    out_dtype: Any
    state_dtype: Any

    def attach(self, master: Any, grad: Any) -> None:  # noqa: B027 (a hook: most need none)
        """``master`` is stepped from ``grad`` from now on."""

    @abstractmethod
    def init_state(self, step: Any, master: Any) -> None:
        """Make ``step``'s state for ``master`` (zeros, step 0) before its first step."""

    @abstractmethod
    def step(self, step: Any, master: Any, grad: Any, out: Any) -> None:
        """One step of ``step`` (the bucket's ``torch.optim`` instance) on ``master`` from
        ``grad``, writing the working weights into ``out`` (None when ``out_dtype`` is)."""


class TorchFused(BucketKernel):
    """PyTorch's fused CPU kernel: fp32 gradient in, the master uploaded."""

    name = "torch-fused"

    def __init__(self) -> None:
        import torch

        self.grad_dtype = torch.float32
        self.out_dtype = None
        self.state_dtype = torch.float32

    def attach(self, master: Any, grad: Any) -> None:
        master.grad = grad

    def init_state(self, step: Any, master: Any) -> None:
        group = step.param_groups[0]
        rate, group["lr"] = group["lr"], 0.0
        step.step()  # makes the state; changes no weight
        group["lr"] = rate
        step.state[master]["step"].zero_()

    def step(self, step: Any, master: Any, grad: Any, out: Any) -> None:
        master.grad = grad  # one of the bucket's buffers (two under the delayed update)
        step.step()


def native_refusal(optimizer: Any, working_dtype: Any) -> str | None:
    """Why the native kernel cannot step ``optimizer`` with ``working_dtype`` weights (None:
    it can)."""
    import torch

    kind = type(optimizer)
    if kind not in (torch.optim.Adam, torch.optim.AdamW):
        return f"{kind.__name__} is not Adam or AdamW"
    if str(working_dtype).removeprefix("torch.") not in NATIVE_DTYPES:
        return f"working dtype {working_dtype} is not one of {', '.join(NATIVE_DTYPES)}"
    for index, group in enumerate(optimizer.param_groups):
        for option in ("amsgrad", "differentiable"):
            if group.get(option):
                return f"param group {index} sets {option}"
    try:
        importlib.import_module("hpcmem._optim")
    except ImportError as error:
        return f"hpcmem._optim is not built ({error})"
    return None


class NativeAdam(BucketKernel):
    """hpcmem's Adam/AdamW (module docstring) in ``dtype``, its moments in ``state_dtype``
    (None: fp32), on threads bound one to each of ``cpus`` (None: ``threads`` unbound
    threads); ``isa`` the instruction set (None: the best this CPU runs)."""

    def __init__(self, dtype: Any, *, threads: int, cpus: list[int] | None = None,
                 isa: str | None = None, state_dtype: Any = None) -> None:
        import torch

        self._native = importlib.import_module("hpcmem._optim")
        self.isa = isa or self._native.instruction_sets()[0]
        self.name = f"hpcmem-{self.isa}"
        self.grad_dtype = dtype
        self.out_dtype = None if dtype == torch.float32 else dtype
        self.state_dtype = state_dtype or torch.float32
        bound = [-1] * threads if cpus is None else [cpus[i % len(cpus)] for i in range(threads)]
        self._pool = self._native.Pool(bound)
        self._torch = torch
        self._seeds: dict[int, int] = {}  # by id of a master: its stochastic rounding's

    def attach(self, master: Any, grad: Any) -> None:
        self._seeds[id(master)] = len(self._seeds)

    def init_state(self, step: Any, master: Any) -> None:
        torch = self._torch
        step.state[master] = {
            "step": torch.zeros((), dtype=torch.float32),
            "exp_avg": torch.zeros_like(master, dtype=self.state_dtype),
            "exp_avg_sq": torch.zeros_like(master, dtype=self.state_dtype),
        }

    def step(self, step: Any, master: Any, grad: Any, out: Any) -> None:
        if master not in step.state:
            self.init_state(step, master)
        state = step.state[master]
        state["step"] += 1
        group = step.param_groups[0]
        count = float(state["step"])
        lr, (beta1, beta2) = float(group["lr"]), (float(b) for b in group["betas"])
        decay = float(group["weight_decay"])
        decoupled = isinstance(step, self._torch.optim.AdamW) or group.get(
            "decoupled_weight_decay", False)
        tensors = {"master": master, "exp_avg": state["exp_avg"],
                   "exp_avg_sq": state["exp_avg_sq"], "grad": grad, "out": out}
        self._check(tensors, master.numel())
        self._native.adam_step(
            self._pool, self.isa, master.numel(),
            master.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(),
            _dtype_name(self.state_dtype), grad.data_ptr(), _dtype_name(grad.dtype),
            0 if out is None else out.data_ptr(),
            _dtype_name(out.dtype if out is not None else master.dtype),
            beta2=beta2, one_minus_beta1=1 - beta1, one_minus_beta2=1 - beta2,
            eps=float(group["eps"]),
            step_size=lr / (1 - beta1**count),
            bias_correction2_sqrt=(1 - beta2**count) ** 0.5,
            decay_factor=1 - lr * decay, l2=decay, decoupled=decoupled,
            sign=-1.0 if group.get("maximize") else 1.0,
            seed=_seed(self._seeds.get(id(master), 0), int(count)),
        )

    def _check(self, tensors: dict[str, Any], numel: int) -> None:
        """Every buffer the kernel touches: contiguous, on the CPU, ``numel`` elements, of
        the dtype it is read or written as (raw addresses go to native code)."""
        torch = self._torch
        wanted = {"master": torch.float32, "exp_avg": self.state_dtype,
                  "exp_avg_sq": self.state_dtype, "grad": self.grad_dtype,
                  "out": self.out_dtype}
        for name, tensor in tensors.items():
            if tensor is None and wanted[name] is None:
                continue
            if (tensor is None or tensor.dtype != wanted[name] or tensor.device.type != "cpu"
                    or not tensor.is_contiguous() or tensor.numel() != numel):
                shown = None if tensor is None else (tensor.dtype, tensor.device.type,
                                                     tuple(tensor.shape))
                raise ValueError(f"native Adam step: {name} is {shown}; wanted a contiguous "
                                 f"CPU tensor of {numel} {wanted[name]} elements")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _seed(bucket: int, step: int) -> int:
    """The stochastic rounding's 32-bit seed for ``bucket``'s ``step``: a different stream
    for each."""
    return (bucket * 0x9E3779B1 + step * 0x85EBCA77) & 0xFFFFFFFF


def bucket_kernel(optimizer: Any, working_dtype: Any, *, threads: int,
                  cpus: list[int] | None = None, kind: str | None = None,
                  state_dtype: Any = None) -> BucketKernel:
    """The kernel ``kind`` asks for (``HostOptimizerOffload.host_kernel``): ``torch``,
    PyTorch's fused one; ``native``, hpcmem's, refused with the reason where it cannot step
    ``optimizer`` (:func:`native_refusal`); None, the native kernel where it can, PyTorch's
    otherwise.
    Moments in a ``state_dtype`` other than fp32 need the native kernel."""
    import torch

    narrow = state_dtype is not None and state_dtype != torch.float32
    refusal = native_refusal(optimizer, working_dtype)
    if narrow and kind == "torch":
        raise BudgetError(f"offload state_dtype: {_dtype_name(state_dtype)!r} needs "
                          "host_kernel 'native' (PyTorch's kernel keeps the moments in fp32)")
    if narrow and refusal:
        raise BudgetError(f"offload state_dtype: {_dtype_name(state_dtype)!r} needs the native "
                          f"kernel, which cannot step this job: {refusal}")
    if kind == "torch":
        return TorchFused()
    if refusal is None:
        return NativeAdam(working_dtype, threads=threads, cpus=cpus, state_dtype=state_dtype)
    if kind == "native":
        raise BudgetError(f"offload host_kernel: 'native' cannot step this job: {refusal}")
    return TorchFused()
