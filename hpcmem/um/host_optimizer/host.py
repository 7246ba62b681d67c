"""The host side of the host-optimizer mode: per bucket, fp32 master weights, gradients and
optimizer state in host memory, and the optimizer step of one bucket on the CPU.

Each bucket is one flat fp32 master tensor, stepped by its own instance of the job's
optimizer class with PyTorch's fused CPU kernel (vectorised, on the intra-op threads) and
the hyperparameters of the bucket's param group, copied from the job's optimizer before
every step (a learning-rate schedule applies). Elementwise optimizers only (``ELEMENTWISE``):
stepping a flat bucket is then stepping each parameter in it.

Gradients land, and updated weights leave, through one page-locked buffer per bucket in the
working dtype: the gradient is copied into it from the device, widened into the fp32
gradient, the master stepped, and the master narrowed into the same buffer, which is then
copied to the device. With fp32 working weights, the gradient lands in the fp32 gradient
itself and the master is copied up as it is (both page-locked), with no conversion.
"""

from __future__ import annotations

from typing import Any

from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.offload import ELEMENTWISE
from hpcmem.um.stream.host import ALIGN, HostArena

__all__ = ["IMPLEMENTATION_KEYS", "HostBuckets", "check_supported"]

#: Param-group keys that choose an implementation, not a value: the host sets its own.
IMPLEMENTATION_KEYS = ("params", "foreach", "fused", "capturable", "differentiable")


def check_supported(optimizer: Any) -> None:
    """Refuse an optimizer the host-optimizer mode cannot step (:class:`BudgetError`)."""
    import torch

    if optimizer is None or not any(
        type(optimizer) is getattr(torch.optim, name) for name in ELEMENTWISE
    ):
        name = "no optimizer" if optimizer is None else type(optimizer).__name__
        raise BudgetError(
            f"offload host_optimizer: {name} is not one of torch.optim.{', '.join(ELEMENTWISE)} "
            "(elementwise optimizers stepped on the CPU); use offload strategy 'stream'"
        )


class HostBuckets:
    """Masters, gradients, landing buffers and optimizers of ``buckets`` (see the module
    docstring); ``optimizer`` is the job's, whose state (if any) is taken over."""

    def __init__(
        self, buckets: list[Bucket], optimizer: Any, *, arena: HostArena, working_dtype: Any
    ) -> None:
        import torch

        check_supported(optimizer)
        self._torch = torch
        self.buckets = buckets
        self.masters: list[Any] = []
        self.grads: list[Any] = []
        self.landings: list[Any] = []
        self.optimizers: list[Any] = []
        fp32 = working_dtype == torch.float32
        per_element = 8 if fp32 else working_dtype.itemsize
        arena.reserve(sum(b.numel * per_element + 2 * ALIGN for b in buckets))
        for bucket in buckets:
            if fp32:  # both cross PCIe: page-locked
                master, grad = self._pinned(arena, bucket.numel, torch.float32, 2)
                landing = grad
            else:
                master = torch.zeros(bucket.numel, dtype=torch.float32)
                grad = torch.zeros(bucket.numel, dtype=torch.float32)
                (landing,) = self._pinned(arena, bucket.numel, working_dtype, 1)
            for position, param in enumerate(bucket.params):
                bucket.slot(master, position).copy_(param.detach())
            master.grad = grad
            step = type(optimizer)([master], lr=optimizer.param_groups[bucket.group]["lr"],
                                   fused=True)
            self.masters.append(master)
            self.grads.append(grad)
            self.landings.append(landing)
            self.optimizers.append(step)
        self.sync(optimizer.param_groups)
        self._take_state(optimizer)

    @staticmethod
    def _pinned(arena: HostArena, numel: int, dtype: Any, count: int) -> list[Any]:
        import torch

        like = torch.empty(numel, dtype=dtype, device="meta")
        return [arena.take(like).zero_() for _ in range(count)]

    def sync(self, param_groups: list[dict[str, Any]]) -> None:
        """Take the hyperparameters of the job's param groups (a schedule may change them)."""
        for bucket, step in zip(self.buckets, self.optimizers, strict=True):
            group = param_groups[bucket.group]
            step.param_groups[0].update(
                {k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS}
            )

    def _take_state(self, optimizer: Any) -> None:
        """Copy the job's optimizer state (made before attach, e.g. by a step at learning
        rate 0) into the buckets' state; a fresh optimizer's state is made at its first step."""
        for index, bucket in enumerate(self.buckets):
            states = [optimizer.state.get(p) for p in bucket.params]
            if not any(states):
                continue
            step = self.optimizers[index]
            rate = step.param_groups[0]["lr"]
            step.param_groups[0]["lr"] = 0.0  # makes the state; changes no weight
            step.step()
            step.param_groups[0]["lr"] = rate
            own = step.state[self.masters[index]]
            for key, value in own.items():
                if not isinstance(value, self._torch.Tensor):
                    continue
                if value.numel() == bucket.numel:
                    for position, state in enumerate(states):
                        if state and key in state:
                            bucket.slot(value, position).copy_(state[key])
                else:
                    first = next(s for s in states if s and key in s)
                    value.copy_(first[key])

    def step_bucket(self, index: int, missing: list[int]) -> Any:
        """Step bucket ``index`` from the gradient in its landing buffer (the positions in
        ``missing`` had none: stepped with a zero gradient); the host tensor to copy up."""
        bucket, landing = self.buckets[index], self.landings[index]
        for position in missing:
            bucket.slot(landing, position).zero_()
        grad, master = self.grads[index], self.masters[index]
        if landing is not grad:
            grad.copy_(landing)
        self.optimizers[index].step()
        if landing is grad:
            return master
        landing.copy_(master)
        return landing

    def source(self, index: int) -> Any:
        """The host tensor holding bucket ``index``'s weights in the working dtype."""
        landing = self.landings[index]
        if landing is self.grads[index]:
            return self.masters[index]
        landing.copy_(self.masters[index])
        return landing

    def give_back(self, optimizer: Any) -> None:
        """Put masters and state into the job's parameters and optimizer (fp32, host)."""
        for index, bucket in enumerate(self.buckets):
            own = self.optimizers[index].state.get(self.masters[index], {})
            for position, param in enumerate(bucket.params):
                param.data = bucket.slot(self.masters[index].detach(), position)
                param.grad = None
                optimizer.state[param] = {
                    key: bucket.slot(value, position)
                    if isinstance(value, self._torch.Tensor) and value.numel() == bucket.numel
                    else (value.clone() if isinstance(value, self._torch.Tensor) else value)
                    for key, value in own.items()
                }
