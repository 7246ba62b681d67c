"""The host side of the host-optimizer mode: per bucket, fp32 master weights, gradients and
optimizer state in host memory, and the optimizer step of one bucket on the CPU.

Each bucket is one flat fp32 master tensor, stepped by its own instance of the job's
optimizer class with PyTorch's fused CPU kernel (vectorised, on the intra-op threads) and
the hyperparameters of the bucket's param group, copied from the job's optimizer before
every step (a learning-rate schedule applies). Elementwise optimizers only (``ELEMENTWISE``):
stepping a flat bucket is then stepping each parameter in it.

Gradients land in the fp32 gradient and updated weights leave from the fp32 master, both
page-locked, so the CPU does the optimizer's arithmetic and nothing else: the casts from and
to the working dtype run on the GPU (:mod:`.engine`). On an H200 the CPU was the bound
(casting bf16 gradients up and weights down on the host took the bucket steps of GPT-2-large
from the optimizer's 28 bytes of memory traffic per parameter to 40), while PCIe had room
for fp32 both ways (``docs/budget-streaming.md``).
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
    """Masters, gradients and optimizers of ``buckets`` (see the module docstring);
    ``optimizer`` is the job's, whose state (if any) is taken over."""

    def __init__(self, buckets: list[Bucket], optimizer: Any, *, arena: HostArena) -> None:
        import torch

        check_supported(optimizer)
        self._torch = torch
        self.buckets = buckets
        self.masters: list[Any] = []
        self.grads: list[Any] = []
        self.optimizers: list[Any] = []
        arena.reserve(sum(b.numel * 8 + 2 * ALIGN for b in buckets))
        for bucket in buckets:
            like = torch.empty(bucket.numel, dtype=torch.float32, device="meta")
            master, grad = (arena.take(like).zero_() for _ in range(2))
            for position, param in enumerate(bucket.params):
                bucket.slot(master, position).copy_(param.detach())
            master.grad = grad
            step = type(optimizer)([master], lr=optimizer.param_groups[bucket.group]["lr"],
                                   fused=True)
            self.masters.append(master)
            self.grads.append(grad)
            self.optimizers.append(step)
        self.sync(optimizer.param_groups)
        self._take_state(optimizer)

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

    def state(self, index: int) -> dict[str, Any]:
        """Bucket ``index``'s optimizer state (empty before its first step)."""
        return self.optimizers[index].state.get(self.masters[index], {})

    def state_keys(self, index: int) -> list[str]:
        """The keys of bucket ``index``'s state tensors as large as the bucket, sorted."""
        numel = self.buckets[index].numel
        return sorted(k for k, v in self.state(index).items()
                      if isinstance(v, self._torch.Tensor) and v.numel() == numel)

    def state_count(self) -> int:
        """Optimizer state tensors per element, as large as a bucket (AdamW: 2)."""
        return len(self.state_keys(0))

    def step_bucket(self, index: int, missing: list[int]) -> None:
        """Step bucket ``index`` from the gradient landed in it (the positions in ``missing``
        had none: stepped with a zero gradient)."""
        bucket = self.buckets[index]
        for position in missing:
            bucket.slot(self.grads[index], position).zero_()
        self.optimizers[index].step()

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
