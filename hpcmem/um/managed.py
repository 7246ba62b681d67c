"""Managed memory: one CUDA managed-memory pool per type of training data, and the routing.

Each type (params, activations, inputs) gets a ``torch.cuda.MemPool`` backed by its own
malloc/free pair in ``libhpcmem_um`` through ``CUDAPluggableAllocator``, so PyTorch's caching
front end stays and every new segment gets the type's advice. Allocations are routed with
``torch._C._cuda_beginAllocateToPool``, which covers every thread and stream (autograd's
backward threads too); one route is active at a time and phases switch it.

With a GPU budget a strategy takes the model and optimizer over (:mod:`hpcmem.um.strategy`):
the host optimizer (working weights on the GPU, the optimizer on the CPU) or the streamed
strategy (everything in pinned host memory, visiting the GPU around its use); what either
keeps on the GPU sits in the activations pool, placed there and counted against the budget.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpcmem.um import guard
from hpcmem.um.budget.offload import Offload
from hpcmem.um.errors import BudgetError, UnifiedMemoryError
from hpcmem.um.memory import MemoryScopes
from hpcmem.um.native import Abi, load_native, require_cuda
from hpcmem.um.policy import TYPES, Policy
from hpcmem.um.prefetch import PrefetchHooks
from hpcmem.um.tensors import host_view, tensor_bytes

__all__ = ["ManagedMemory"]

_open_lock = threading.Lock()
#: the open instance, weakly: a closed one must be free to die and give its pools back
_open_instance: weakref.ref[ManagedMemory] | None = None


class ManagedMemory(MemoryScopes):
    """:class:`MemoryScopes` over CUDA managed memory (the ``um`` and ``hpcmem`` presets)."""

    def __init__(self, policy: str | Path | Policy, device: int = 0, **kwargs: Any) -> None:
        super().__init__(policy, device, **kwargs)
        torch = require_cuda(self.policy.name)
        self._torch = torch
        self.device = torch.device("cuda", device)
        self._native = load_native()
        self._abi = Abi.of(self._native)
        self._route_stack: list[str] = []
        self._hooks: list[Any] = []
        self._params: list[Any] = []
        self._prefetch: PrefetchHooks | None = None
        free, total = torch.cuda.mem_get_info(self.device)
        self.device_total_bytes = total
        headroom = (
            guard.default_headroom(total) if self.headroom_bytes is None else self.headroom_bytes
        )
        self._limit = guard.managed_limit(free, headroom, self.allow_oversubscription)
        self._claim()
        _make_process_caches(torch, self.device)
        self._configure_native()
        from torch.cuda.memory import CUDAPluggableAllocator, MemPool

        path = self._native.library_path()
        self._allocators = {
            t: CUDAPluggableAllocator(path, f"hpcmem_um_malloc_{t}", f"hpcmem_um_free_{t}")
            for t in TYPES
        }
        self._pools = {t: MemPool(self._allocators[t].allocator()) for t in TYPES}
        self._reserved_baseline = torch.cuda.memory_reserved(self.device) - self._leftover_bytes

    # -- set-up -------------------------------------------------------------------------
    def _claim(self) -> None:
        global _open_instance
        with _open_lock:
            current = _open_instance() if _open_instance is not None else None
            if current is not None and not current._closed:
                raise UnifiedMemoryError(
                    "another UnifiedMemory is open in this process: close() it first "
                    "(the native allocator's policies and counters are process-wide)"
                )
            _open_instance = weakref.ref(self)

    def _configure_native(self) -> None:
        um, abi = self._native, self._abi
        um.reset_counters()
        self._epoch = um.begin_epoch()
        # Segments an earlier job left alive (its tensors still referenced) are not ours: the
        # free memory the limit came from already excludes them, and so does the budget.
        self._baseline = {t: um.counters(abi.type_ids[t]) for t in TYPES}
        self._leftover_bytes = um.managed_bytes()
        self._leftover_gpu = um.gpu_bytes()
        um.set_limit(abi.unlimited if self._limit is None else self._limit + self._leftover_bytes)
        # Under a budget the strategy keeps the GPU working set within it; the library
        # places every activations segment on the GPU and counts it (no spill to read in place).
        budget = self.gpu_budget
        for type_name in TYPES:
            tp = self.policy.type_policy(type_name)
            um.set_policy(
                abi.type_ids[type_name],
                abi.location_ids[tp.preferred_location],
                sum(abi.access_bits[a] for a in tp.accessed_by),
                tp.read_mostly,
                tp.prefetch == "on_alloc",
            )
            # Under a budget the params pool is host memory: the model is built there and
            # then streamed from pinned copies; only the activations pool holds GPU memory.
            quota = abi.unlimited
            if budget is not None and type_name == "params":
                quota = self._baseline["params"]["gpu_bytes"]
            um.set_gpu_quota(abi.type_ids[type_name], quota)

    # -- routing ------------------------------------------------------------------------
    def _begin(self, type_name: str) -> None:
        self._torch._C._cuda_beginAllocateToPool(self.device.index, self._pools[type_name].id)

    def _end(self, type_name: str) -> None:
        # Each begin increments the pool's use count (as a graph capture does); release it,
        # or the pool never becomes freeable and its segments outlive the job.
        pool_id = self._pools[type_name].id
        self._torch._C._cuda_endAllocateToPool(self.device.index, pool_id)
        self._torch._C._cuda_releasePool(self.device.index, pool_id)

    def _enter(self, type_name: str) -> None:
        if self._closed:
            raise UnifiedMemoryError("this UnifiedMemory is closed")
        current = self._route_stack[-1] if self._route_stack else None
        if current != type_name:
            if current is not None:
                self._end(current)
            self._begin(type_name)
        self._route_stack.append(type_name)

    def _exit(self) -> None:
        type_name = self._route_stack.pop()
        previous = self._route_stack[-1] if self._route_stack else None
        if previous != type_name:
            self._end(type_name)
            if previous is not None:
                self._begin(previous)

    @contextmanager
    def _route(self, type_name: str) -> Iterator[None]:
        refusals = self._refusals()
        self._enter(type_name)
        try:
            yield
        except self._torch.OutOfMemoryError as error:
            if self._refusals() > refusals and not isinstance(error, guard.OversubscriptionError):
                raise guard.OversubscriptionError(self._guard_message(type_name)) from error
            raise
        finally:
            self._exit()

    def _renew_activations(self) -> None:
        """A new activations pool in place of the current one. PyTorch gives a pool's cached
        segments back only when the pool is gone, so one budget strategy's cache (a whole
        batch's activations) would otherwise stay on the device beside the next one's."""
        from torch.cuda.memory import MemPool

        routed = bool(self._route_stack) and self._route_stack[-1] == "activations"
        if routed:
            self._end("activations")
        self._pools["activations"] = MemPool(self._allocators["activations"].allocator())
        self._torch.cuda.empty_cache()  # the old pool's free segments
        if routed:
            self._begin("activations")

    @contextmanager
    def _unrouted(self) -> Iterator[None]:
        """Allocations in PyTorch's own device memory (no pool) inside, whatever is routed."""
        current = self._route_stack[-1] if self._route_stack else None
        if current is not None:
            self._end(current)
        try:
            yield
        finally:
            if current is not None:
                self._begin(current)

    def params(self):
        return self._route("params")

    @contextmanager
    def activations(self) -> Iterator[None]:
        """Forward and backward in the activations pool; parameters of an attached model get
        their gradients in the params pool first, or, under a budget, are streamed."""
        if self._params and self._strategy is None:
            self._ensure_grads()
        with self._route("activations"):
            if self._strategy is None:
                yield
            else:
                with self._strategy.scope():
                    yield

    def inputs(self):
        return self._route("inputs")

    def _ensure_grads(self) -> None:
        missing = [p for p in self._params if p.requires_grad and p.grad is None]
        if missing:
            with self._route("params"):
                for param in missing:
                    param.grad = self._torch.zeros_like(param)

    # -- model and optimizer ----------------------------------------------------------
    def attach(self, model: Any, optimizer: Any | None = None,
               offload: Offload | None = None, process_group: Any = None) -> None:
        """Hook a model and its optimizer into the pools.

        Without a budget, gradients are allocated persistently in the params pool,
        ``optimizer.step`` runs in the params phase (optimizer state made lazily lands there)
        and a ``before_use`` params policy prefetches the next layers on a side stream. With a
        budget, the strategy ``offload``'s type names (None or a plain ``Offload``: planned)
        takes the model and optimizer over (:mod:`hpcmem.um.strategy`), data-parallel over
        ``process_group`` (None: the default group, if ``torch.distributed`` has one).
        """
        if self.gpu_budget is not None:
            from hpcmem.um.budget.transport import CudaTransport
            from hpcmem.um.strategy import make_strategy

            transport = CudaTransport(self.device, self._native, self._leftover_gpu)
            self._chunk_loss(model, offload or Offload())
            self._strategy = make_strategy(
                model, optimizer, offload=offload or Offload(), transport=transport,
                budget=self.gpu_budget, priority=self.policy.priority,
                device_scope=lambda: self._route("activations"),
                plain_scope=self._unrouted, process_group=process_group,
                batch_split=self._batch_split, release_device_cache=self._renew_activations,
            )
            return
        if offload is not None:
            raise BudgetError("attach: offload needs a gpu_budget")
        if process_group is not None:
            raise BudgetError("attach: process_group needs a gpu_budget; without one, wrap the "
                              "model in DistributedDataParallel")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._ensure_grads()
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._step_pre_hook))
            self._hooks.append(optimizer.register_step_post_hook(self._step_post_hook))
        if self.policy.params.prefetch == "before_use":
            self._prefetch = PrefetchHooks(
                model, self.device, lambda: self.segments("params"), self._prefetch_to_gpu
            )

    def _step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._enter("params")

    def _step_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._exit()

    # -- inputs -----------------------------------------------------------------------
    def stage(self, batch: Any) -> Any:
        """A CPU tensor's copy on the device.

        A pinned batch (``DataLoader(pin_memory=True)``) is copied by DMA on the current
        stream into memory placed on the GPU (the activations pool), as the ``cuda`` preset
        does. Any other batch is written by the CPU straight into the inputs pool (after the
        stream is done with the block's previous use); a ``before_use`` inputs policy then
        prefetches it to the GPU.
        """
        torch = self._torch
        if batch.is_pinned():
            with self._route("activations"):
                out = torch.empty(batch.shape, dtype=batch.dtype, device=self.device)
            return out.copy_(batch, non_blocking=True)
        with self.inputs():
            out = torch.empty(batch.shape, dtype=batch.dtype, device=self.device)
        torch.cuda.current_stream(self.device).synchronize()
        host_view(out).copy_(batch)
        if self.policy.inputs.prefetch == "before_use":
            self.prefetch(out)
        return out

    def _prefetch_to_gpu(self, ptr: int, nbytes: int, stream: int) -> None:
        self._native.prefetch(ptr, nbytes, self.device.index, stream, self._abi.type_ids["params"])

    def segments(self, type_name: str) -> list[tuple[int, int, bool]]:
        return [
            (ptr, size, on_gpu)
            for ptr, size, on_gpu, epoch in self._native.segments(self._abi.type_ids[type_name])
            if epoch == self._epoch
        ]

    def prefetch(self, tensor: Any, to: str = "gpu") -> None:
        if to not in ("gpu", "cpu"):
            raise ValueError(f"to: {to!r} is not one of gpu, cpu")
        location = self.device.index if to == "gpu" else self._abi.cpu_id
        stream = self._torch.cuda.current_stream(self.device).cuda_stream
        self._native.prefetch(tensor.data_ptr(), tensor_bytes(tensor), location, stream)

    # -- guard --------------------------------------------------------------------------
    @property
    def limit_bytes(self) -> int | None:
        return self._limit

    def check_request(self, nbytes: int) -> None:
        guard.check_request(nbytes, self._managed_bytes(), self._limit)

    def _refusals(self) -> int:
        return sum(self._native.counters(i)["refusals"] for i in self._abi.type_ids.values())

    def _guard_message(self, type_name: str) -> str:
        refused = self._native.counters(self._abi.type_ids[type_name])["last_refused_bytes"]
        return guard.refusal_message(refused, self._managed_bytes(), self._limit or 0)

    def _managed_bytes(self) -> int:
        # This job's managed bytes (segments earlier jobs left alive excluded).
        return max(0, self._native.managed_bytes() - self._leftover_bytes)

    # -- statistics ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-type counters, managed and GPU-resident bytes, and bytes that escaped the pools.

        ``escaped_bytes`` is what PyTorch reserved on the device since this object was made
        beyond the managed segments of the three pools and the budget strategy's own plain
        device memory: memory nothing accounts for.
        ``peak_gpu_resident_bytes`` is the most bytes of segments placed on the GPU at once
        since the last :meth:`reset_stats`; ``offload`` is the budget strategy's
        :meth:`~hpcmem.um.budget.protocol.BudgetStrategy.stats`.
        """
        types = {t: self._counters(t) for t in TYPES}
        managed = self._managed_bytes()
        reserved = self._torch.cuda.memory_reserved(self.device) - self._leftover_bytes
        stats = {
            "policy": self.policy.name,
            "managed": True,
            **types,
            "managed_bytes": managed,
            "gpu_resident_bytes": sum(c["gpu_bytes"] for c in types.values()),
            "peak_gpu_resident_bytes": (
                max(0, self._native.gpu_peak_bytes() - self._leftover_gpu)
                if self._strategy is None
                else self._strategy.stats()["peak_gpu_resident_bytes"]
            ),
            "gpu_budget_bytes": self.gpu_budget,
            "limit_bytes": self._limit,
            "device_total_bytes": self.device_total_bytes,
            "escaped_bytes": max(0, reserved - managed - self._strategy_plain_bytes()
                                 - self._reserved_baseline),
        }
        if self._strategy is not None:
            stats["offload"] = self._offload_stats()
        return stats

    def _counters(self, type_name: str) -> dict[str, int]:
        # Live, peak, segment and GPU bytes net of what earlier jobs left alive.
        counters = self._native.counters(self._abi.type_ids[type_name])
        base = self._baseline[type_name]
        for key in ("live_bytes", "peak_bytes", "segments", "gpu_bytes"):
            counters[key] = max(0, counters[key] - base[key])
        return counters

    def _strategy_plain_bytes(self) -> int:
        return 0 if self._strategy is None else self._strategy.plain_bytes

    def reset_stats(self) -> None:
        self._native.reset_counters()
        self._reserved_baseline = (
            self._torch.cuda.memory_reserved(self.device) - self._native.managed_bytes()
            - self._strategy_plain_bytes()
        )
        if self._strategy is not None:
            self._strategy.reset_stats()

    # -- lifetime -----------------------------------------------------------------------
    def _release(self) -> None:
        while self._route_stack:
            self._exit()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._prefetch is not None:
            self._prefetch.remove()
        if self._strategy is not None:
            self._strategy.close()
        self._params = []


def _make_process_caches(torch: Any, device: Any) -> None:
    """Create what PyTorch keeps for the whole process (the cuBLAS handle and workspace of
    the current stream) before any routing, in its own device memory: made inside a pool, it
    would keep that pool's segment alive and tie later jobs to this job's placement."""
    with torch.cuda.device(device):
        a = torch.ones(8, 8, device=device)
        (a @ a).sum().item()
