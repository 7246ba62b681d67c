"""The host side of the host-optimizer mode: per bucket, fp32 master weights, gradients and
optimizer state in host memory, and the optimizer step of one bucket on the CPU.

Each bucket is one flat fp32 master tensor with the state of its own instance of the job's
optimizer class, whose hyperparameters are those of the bucket's param group, copied from
the job's optimizer before every step (a learning-rate schedule applies). Elementwise
optimizers only (``ELEMENTWISE``): stepping a flat bucket is then stepping each parameter
in it. The step itself is the bucket kernel's (:mod:`.kernel`): hpcmem's native Adam
reads the gradient in the working dtype and writes the working weights beside the master
(``outs``: what is uploaded); PyTorch's fused kernel reads an fp32 gradient and the master
is uploaded, the casts then running on the GPU (:mod:`.engine`). Gradients land and
weights leave page-locked. Under the delayed update a bucket has two gradient buffers, one
per step parity: the next step's gradients land in one while the CPU steps from the other.
Under data parallelism (``ranks``) each of these covers only this rank's shard of the
bucket (:meth:`hpcmem.um.budget.parallel.Ranks.shard`): host memory per rank falls with
the number of ranks; the masters and state are gathered back whole at :meth:`give_back`.
"""

from __future__ import annotations

from typing import Any

from hpcmem.um.budget.host import ALIGN, HostArena
from hpcmem.um.budget.offload import ELEMENTWISE
from hpcmem.um.budget.parallel import Ranks
from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.host_optimizer.kernel import BucketKernel

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
            "(elementwise optimizers stepped on the CPU); use StreamedOffload()"
        )


class HostBuckets:
    """Masters, gradients (``grad_sets`` buffers each), optimizers and uploaded weights of
    ``buckets``, stepped by ``kernel`` (see the module docstring); ``optimizer`` is the
    job's, whose state (if any) is taken over; ``ranks``: this rank's shards only."""

    def __init__(self, buckets: list[Bucket], optimizer: Any, *, arena: HostArena,
                 kernel: BucketKernel, grad_sets: int = 1, ranks: Ranks | None = None
                 ) -> None:
        import torch

        check_supported(optimizer)
        self._torch = torch
        self.buckets = buckets
        self.kernel = kernel
        self.ranks = ranks
        #: each bucket's elements held here: this rank's shard, or all of them
        self.ranges = [ranks.shard(b.numel) if ranks else (0, b.numel) for b in buckets]
        self.masters: list[Any] = []
        self.grads: list[list[Any]] = [[] for _ in range(grad_sets)]  # by parity, bucket
        self.outs: list[Any] = []  # the working weights the kernel writes (if it does)
        self.optimizers: list[Any] = []
        per_element = 4 + grad_sets * kernel.grad_dtype.itemsize + (
            kernel.out_dtype.itemsize if kernel.out_dtype is not None else 0)
        numels = [end - start for start, end in self.ranges]
        arena.reserve(sum(n * per_element + (2 + grad_sets) * ALIGN for n in numels))
        for bucket, numel in zip(buckets, numels, strict=True):
            master = self._take(arena, numel, torch.float32)
            grads = [self._take(arena, numel, kernel.grad_dtype) for _ in range(grad_sets)]
            out = None if kernel.out_dtype is None else self._take(arena, numel, kernel.out_dtype)
            for held in (master, out) if out is not None else (master,):
                self._scatter(bucket.index, held, [p.detach() for p in bucket.params])
            kernel.attach(master, grads[0])
            step = type(optimizer)([master], lr=optimizer.param_groups[bucket.group]["lr"],
                                   fused=True)
            self.masters.append(master)
            for parity, grad in enumerate(grads):
                self.grads[parity].append(grad)
            if out is not None:
                self.outs.append(out)
            self.optimizers.append(step)
        self.sync(optimizer.param_groups)
        self._take_state(optimizer)

    def _take(self, arena: HostArena, numel: int, dtype: Any) -> Any:
        """``numel`` zeros of ``dtype`` from ``arena``."""
        like = self._torch.empty(numel, dtype=dtype, device="meta")
        return arena.take(like).zero_()

    def _scatter(self, index: int, held: Any, values: list[Any | None]) -> None:
        """Parameter ``i``'s ``values[i]`` (None: left as it is) into ``held``, bucket
        ``index``'s part held here, by way of the whole bucket when that is a shard."""
        bucket, (start, end) = self.buckets[index], self.ranges[index]
        whole = held if end - start == bucket.numel else self._torch.zeros(
            bucket.numel, dtype=held.dtype)
        if whole is not held:
            whole[start:end].copy_(held)
        for position, value in enumerate(values):
            if value is not None:
                bucket.slot(whole, position).copy_(value)
        if whole is not held:
            held.copy_(whole[start:end])

    def whole(self, index: int, held: Any) -> Any:
        """Bucket ``index``'s whole buffer of which ``held`` is the part held here."""
        return held if self.ranks is None else self.ranks.gathered(held)

    def upload_source(self, index: int) -> Any:
        """What goes up to bucket ``index``'s working weights: the weights the kernel wrote,
        or the master."""
        return self.outs[index] if self.outs else self.masters[index]

    def sync(self, param_groups: list[dict[str, Any]], index: int | None = None) -> None:
        """Take the hyperparameters of the job's param groups (a schedule may change them):
        into bucket ``index``'s optimizer (None: every bucket's)."""
        indices = range(len(self.buckets)) if index is None else (index,)
        for i in indices:
            group = param_groups[self.buckets[i].group]
            self.optimizers[i].param_groups[0].update(
                {k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS}
            )

    def _take_state(self, optimizer: Any) -> None:
        """Copy the job's optimizer state (made before attach, e.g. by a step at learning
        rate 0, or loaded from a checkpoint) into the buckets' state; a fresh optimizer's
        state is made at its first step."""
        self.take_states(optimizer.state.get)

    def take_states(self, state_of: Any) -> None:
        """Each parameter's optimizer state ``state_of(param)`` (None: none) into the
        buckets' state: this rank's part of each bucket-sized tensor, the first parameter's
        value of the others (``step``)."""
        for index, bucket in enumerate(self.buckets):
            states = [state_of(p) for p in bucket.params]
            if not any(states):
                continue
            step = self.optimizers[index]
            if not step.state.get(self.masters[index]):
                self.kernel.init_state(step, self.masters[index])
            own = step.state[self.masters[index]]
            for key, value in own.items():
                if not isinstance(value, self._torch.Tensor):
                    continue
                if value.numel() == self.masters[index].numel():
                    self._scatter(index, value, [s[key] if s and key in s else None
                                                 for s in states])
                else:
                    first = next(s for s in states if s and key in s)
                    value.copy_(first[key])

    def load_weights(self, index: int, values: list[Any | None]) -> None:
        """Parameter ``i``'s fp32 weight ``values[i]`` (None: kept) into bucket ``index``'s
        master, and into the weights the kernel writes."""
        for held in (self.masters[index], *(self.outs[index:index + 1] if self.outs else ())):
            self._scatter(index, held, [None if v is None else v.detach().to(held.dtype)
                                        for v in values])

    def state(self, index: int) -> dict[str, Any]:
        """Bucket ``index``'s optimizer state (empty before its first step)."""
        return self.optimizers[index].state.get(self.masters[index], {})

    def state_keys(self, index: int) -> list[str]:
        """The keys of bucket ``index``'s state tensors as large as the bucket, sorted."""
        numel = self.masters[index].numel()
        return sorted(k for k, v in self.state(index).items()
                      if isinstance(v, self._torch.Tensor) and v.numel() == numel)

    def widen_state(self, index: int) -> None:
        """Bucket ``index``'s moments in fp32 from now on (the GPU steps it)."""
        state = self.state(index)
        for key in self.state_keys(index):
            state[key] = state[key].float()

    def state_count(self) -> int:
        """Optimizer state tensors per element, as large as a bucket (AdamW: 2)."""
        return len(self.state_keys(0))

    def held_bytes(self) -> int:
        """Host bytes of the masters, gradients, written weights and optimizer state."""
        tensors = [*self.masters, *self.outs, *(g for grads in self.grads for g in grads),
                   *(v for i in range(len(self.buckets)) for v in self.state(i).values()
                     if isinstance(v, self._torch.Tensor))]
        return sum(t.numel() * t.element_size() for t in tensors)

    def square(self, index: int, missing: list[int], parity: int = 0) -> float:
        """The squared L2 norm of bucket ``index``'s gradient in its buffer ``parity``, the
        positions in ``missing`` zeroed first (they had none)."""
        bucket, grad = self.buckets[index], self.grads[parity][index]
        for position in missing:
            bucket.slot(grad, position).zero_()
        return float(self._torch.linalg.vector_norm(grad, dtype=self._torch.float32)) ** 2

    def step_bucket(self, index: int, missing: list[int], parity: int = 0,
                    scale: float = 1.0) -> None:
        """Step bucket ``index`` from the gradient landed in its buffer ``parity`` (the
        positions in ``missing`` had none: stepped with a zero gradient), times ``scale``."""
        bucket, grad = self.buckets[index], self.grads[parity][index]
        for position in missing:
            bucket.slot(grad, position).zero_()
        if scale != 1.0:
            grad.mul_(scale)
        out = self.outs[index] if self.outs else None
        self.kernel.step(self.optimizers[index], self.masters[index], grad, out)

    def param_states(self, index: int) -> list[dict[str, Any]]:
        """Each parameter's optimizer state in bucket ``index`` as the job's optimizer keeps
        it (fp32 views or copies, whole on every rank; empty before the first step)."""
        torch = self._torch
        bucket, held = self.buckets[index], self.masters[index].numel()
        own = {key: self.whole(index, value)
               if isinstance(value, torch.Tensor) and value.numel() == held else value
               for key, value in self.state(index).items()}
        return [{key: bucket.slot(value, position).float()
                 if isinstance(value, torch.Tensor) and value.numel() == bucket.numel
                 else (value.clone() if isinstance(value, torch.Tensor) else value)
                 for key, value in own.items()} for position in range(len(bucket.params))]

    def give_back(self, optimizer: Any) -> None:
        """Put masters and state into the job's parameters and optimizer (fp32, host; whole
        on every rank)."""
        for index, bucket in enumerate(self.buckets):
            master = self.whole(index, self.masters[index].detach())
            for position, (param, state) in enumerate(zip(bucket.params,
                                                          self.param_states(index),
                                                          strict=True)):
                param.data = bucket.slot(master, position)
                param.grad = None
                optimizer.state[param] = state
