"""The timed training loop: fused AdamW, bf16 autocast or fp32, warm-up, per-step wall-clock times.

Memory goes through a ``hpcmem.um.UnifiedMemory``: model, gradients, optimizer
state and the loss log are made in its params scope, each batch in its inputs
scope (allocated there and written by the CPU), forward and backward in its
activations scope. Like a data loader that prefetches one batch, the CPU writes
batch i+1 while the device runs step i (two batches live at a time; writing
managed memory while kernels run needs ``concurrentManagedAccess``, which Linux
GPUs since Pascal have). A step is
wall-clock time from the end of the previous one until both its kernels and the
next batch are done (the device synchronised), so a CPU write that makes the GPU
wait, or faults pages back and forth, shows in the figure. The first step
(producing its own batch, and first touch of every page) is reported on its own;
the statistics cover the steps after the warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hpcmem.train.models import CNNShape, TransformerShape

if TYPE_CHECKING:
    import torch

    from hpcmem.train.data import SyntheticImages, SyntheticTokens
    from hpcmem.um.budget.offload import Offload

__all__ = [
    "LEARNING_RATE",
    "StepStats",
    "TrainResult",
    "materialize_optimizer_state",
    "step_stats",
    "train",
]

LEARNING_RATE = 1e-4
#: Losses kept at each end of the run in the record.
LOSSES_KEPT = 5


@dataclass(frozen=True)
class StepStats:
    """Step-time statistics in milliseconds."""

    median: float
    p10: float
    p90: float


@dataclass(frozen=True)
class TrainResult:
    """What one training run measured."""

    step_ms: list[float]  # every step, warm-up included, in order
    warmup: int
    losses: list[float]  # every step's loss, in order
    items_per_step: int
    memory: dict[str, Any]  # ``um.stats()`` after the last step
    peak_reserved_bytes: int | None  # PyTorch's peak reserved device memory (None on the CPU)
    nvml_peak_bytes: int | None = None  # NVML: the most this process held (None: unknown)
    nvml_device_peak_bytes: int | None = None  # NVML: the device's used memory at most
    held_peak_bytes: int | None = None  # NVML's process figure + managed bytes on the GPU

    @property
    def first_step_ms(self) -> float:
        """Time of the first step (first touch of all memory), ms."""
        return self.step_ms[0]

    @property
    def timed(self) -> StepStats:
        """Statistics of the steps after the warm-up."""
        return step_stats(self.step_ms[self.warmup :])

    def throughput(self) -> float:
        """Items (tokens or images) per second at the median step time."""
        return self.items_per_step / (self.timed.median / 1e3)

    def loss_ends(self) -> dict[str, list[float]]:
        """The first and last ``LOSSES_KEPT`` losses (for loss-equality checks)."""
        return {"first": self.losses[:LOSSES_KEPT], "last": self.losses[-LOSSES_KEPT:]}


def step_stats(times_ms: list[float]) -> StepStats:
    """Median, 10th and 90th percentile (inclusive, linear interpolation) of ``times_ms``."""
    if not times_ms:
        raise ValueError("no timed steps")
    if len(times_ms) == 1:
        return StepStats(times_ms[0], times_ms[0], times_ms[0])
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return StepStats(statistics.median(times_ms), deciles[0], deciles[-1])


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state now (one step at learning rate 0 on zero gradients, then reset)."""
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    for state in optimizer.state.values():
        state["step"].zero_()


@dataclass
class _Staging:
    """Pinned host buffers of the unmanaged path, and the event of their last copy."""

    buffers: dict[str, Any] = field(default_factory=dict)
    copied: Any = None  # torch.cuda.Event, recorded after each copy to the device


def _new_batch(
    data: SyntheticTokens | SyntheticImages,
    memory: Any,
    device: torch.device,
    staging: _Staging,
    pinned_inputs: bool,
) -> dict[str, torch.Tensor]:
    """The next batch on ``device``, written by the CPU.

    Under a managed policy (unless ``pinned_inputs``) the CPU writes it in place into
    managed memory of the inputs pool, then it is prefetched if the inputs policy says
    ``before_use``. Otherwise the CPU writes ``staging`` (pinned host buffers, made once) and
    ``memory.stage`` copies them over on the stream, as PyTorch's data loader does with
    ``pin_memory``. Safe while the device runs the current step: the new batch's memory is
    not the current batch's, and the staging buffers are refilled only after their last
    copy is done.
    """
    import torch

    from hpcmem.um import host_view

    fields = {f.name: (f.shape, getattr(torch, f.dtype)) for f in data.fields()}
    if device.type == "cpu" or (memory.managed and not pinned_inputs):
        with memory.inputs():
            batch = {name: torch.empty(shape, dtype=dtype, device=device)
                     for name, (shape, dtype) in fields.items()}
        if device.type == "cpu":
            data.fill(batch)
            return batch
        data.fill({name: host_view(tensor) for name, tensor in batch.items()})
        if memory.policy.inputs.prefetch == "before_use":
            for tensor in batch.values():
                memory.prefetch(tensor)
        return batch
    if not staging.buffers:
        staging.buffers.update({name: torch.empty(shape, dtype=dtype, pin_memory=True)
                                for name, (shape, dtype) in fields.items()})
        staging.copied = torch.cuda.Event()
    staging.copied.synchronize()  # the previous batch has left the buffers
    data.fill(staging.buffers)
    batch = {name: memory.stage(buffer) for name, buffer in staging.buffers.items()}
    staging.copied.record()
    return batch


def train(
    shape: TransformerShape | CNNShape,
    data: SyntheticTokens | SyntheticImages,
    memory: Any,
    *,
    device: torch.device,
    dtype: str,
    steps: int,
    warmup: int,
    seed: int,
    pinned_inputs: bool = False,
    offload: str | None = None,
    accumulate: int = 1,
    delayed_update: bool = False,
    state_dtype: str = "float32",
    shard: tuple[int, int] | None = None,
) -> TrainResult:
    """Train ``shape`` on ``data`` for ``warmup + steps`` steps under ``memory`` (UnifiedMemory).

    ``pinned_inputs``: batches come in pinned host memory and are staged with
    ``memory.stage`` under every policy (as from ``DataLoader(pin_memory=True)``).
    ``offload``: the budget strategy (``host_optimizer``, ``streamed``; None: planned), its
    working weights in the autocast dtype. ``accumulate``: micro-batches per optimizer step,
    each loss scaled by its share (a step's loss is their mean). ``delayed_update``:
    ZeRO-Offload's one-step delayed update under a budget
    (:class:`~hpcmem.um.budget.offload.HostOptimizerOffload`);
    ``state_dtype`` the dtype of Adam's moments on the host under one. ``shard``: this
    process is rank ``r`` of ``n`` data-parallel ranks (the default process group): each
    batch is the global one, of which it trains on its ``1/n`` of the rows, the gradients
    averaged over the ranks once per step (the budget strategy's own data parallelism, or
    ``DistributedDataParallel``). NVML samples the process's device memory.
    """
    from contextlib import nullcontext

    from hpcmem.um.budget.offload import offload_named
    from hpcmem.um.nvml import NvmlPeak

    chosen = offload_named(offload, working_dtype="bfloat16" if dtype == "bf16" else None,
                           micro_batches=accumulate, delayed_update=delayed_update,
                           state_dtype=state_dtype)
    sampler = (NvmlPeak(device.index or 0, managed=_managed_on_gpu(memory))
               if device.type == "cuda" else nullcontext())
    with sampler:
        model, optimizer, losses = _prepare(shape, memory, device=device, seed=seed,
                                            offload=chosen, total=warmup + steps,
                                            parallel=shard is not None and shard[1] > 1)
        result = _loop(model, optimizer, losses, data, memory, device=device, dtype=dtype,
                       warmup=warmup, pinned_inputs=pinned_inputs, accumulate=accumulate,
                       shard=shard)
    if isinstance(sampler, NvmlPeak):
        result = replace(result, nvml_peak_bytes=sampler.process_bytes,
                         nvml_device_peak_bytes=sampler.device_bytes,
                         held_peak_bytes=sampler.held_bytes)
    return result


def _managed_on_gpu(memory: Any) -> Callable[[], int] | None:
    """The managed bytes placed on the GPU now, which NVML's process figure leaves out
    (None for PyTorch's own allocator)."""
    if not memory.managed:
        return None
    from hpcmem.um.native import load_native

    return load_native().gpu_bytes


def _prepare(shape: TransformerShape | CNNShape, memory: Any, *, device: torch.device,
             seed: int, offload: Offload, total: int, parallel: bool = False
             ) -> tuple[Any, Any, Any]:
    """The model, its AdamW and the losses of ``total`` steps, made inside the params scope;
    the model and optimizer attached to ``memory`` (with ``offload`` under a budget, whose
    strategy then reduces over the default group where ``parallel``; without one, the model
    wrapped in ``DistributedDataParallel``)."""
    import torch

    from hpcmem.train.networks import build

    if device.type == "cuda":  # streams, events and autocast then default to this device
        torch.cuda.set_device(device)
    torch.manual_seed(seed)
    with memory.params():
        with torch.device(device):  # made in place: a 6B model never passes through the host
            model = build(shape)
        # The fused kernel updates every tensor in place: no parameter-sized temporaries.
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        materialize_optimizer_state(optimizer)
        losses = torch.zeros(total, device=device)
    budgeted = getattr(memory, "gpu_budget", None) is not None
    memory.attach(model, optimizer, offload=offload if budgeted else None)
    if parallel and not budgeted:
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, optimizer, losses


def _loop(model: Any, optimizer: Any, losses: Any, data: SyntheticTokens | SyntheticImages,
          memory: Any, *, device: torch.device, dtype: str, warmup: int,
          pinned_inputs: bool, accumulate: int, shard: tuple[int, int] | None = None
          ) -> TrainResult:
    """One timed training step (``accumulate`` micro-batches, one optimizer step) per entry
    of ``losses``; counts and peaks from those after ``warmup``; ``shard``'s rows of each
    batch (:func:`train`), a ``DistributedDataParallel`` model's gradients reduced at the
    last micro-batch only."""
    from contextlib import nullcontext

    import torch

    total = len(losses)
    if device.type == "cuda":  # the context exists now (the model is on the device)
        torch.cuda.reset_peak_memory_stats(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    staging = _Staging()
    times_ms = []
    batch = None
    _synchronize(device)
    for step in range(total):
        start = time.perf_counter()
        if batch is None:  # the first step has no earlier step to hide its batch behind
            batch = _new_batch(data, memory, device, staging, pinned_inputs)
        step_loss = 0.0
        for micro in range(accumulate):
            mine = _rows(batch, shard)
            held_back = micro + 1 < accumulate and hasattr(model, "no_sync")
            with memory.activations(), model.no_sync() if held_back else nullcontext():
                with autocast:
                    loss = model(mine) / accumulate if accumulate > 1 else model(mine)
                loss.backward()
            step_loss = loss.detach() + step_loss
            if micro + 1 == accumulate:
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
            # A prefetching data loader: the CPU makes the next batch while the device still
            # works through this one's kernels; the step ends when both are done.
            last = micro + 1 == accumulate and step + 1 == total
            upcoming = None if last else _new_batch(data, memory, device, staging,
                                                    pinned_inputs)
            del loss, mine
            batch = upcoming  # this batch goes back to the inputs pool
        losses[step] = step_loss
        _synchronize(device)
        times_ms.append((time.perf_counter() - start) * 1e3)
        if step + 1 == warmup:  # counts and peaks of the timed steps only
            memory.reset_stats()
    return TrainResult(
        step_ms=times_ms,
        warmup=warmup,
        losses=losses.tolist(),
        items_per_step=data.items() * accumulate,
        memory=memory.stats(),
        peak_reserved_bytes=(
            torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
        ),
    )


def _rows(batch: dict[str, Any], shard: tuple[int, int] | None) -> dict[str, Any]:
    """Rank ``r``'s ``1/n`` of each tensor's rows, ``shard`` = (r, n); the batch itself
    without one."""
    if shard is None or shard[1] == 1:
        return batch
    rank, world = shard
    return {name: tensor.chunk(world)[rank] for name, tensor in batch.items()}
