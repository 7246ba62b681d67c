"""``UnifiedMemory``: one CUDA managed-memory pool per type of training data, and the routing.

Each type (params, activations, inputs) gets a ``torch.cuda.MemPool`` backed by its own
malloc/free pair in ``libhpcmem_um`` through ``CUDAPluggableAllocator``, so PyTorch's caching
front end stays and every new segment gets the type's advice. Allocations are routed with
``torch._C._cuda_beginAllocateToPool``, which covers every thread and stream (autograd's
backward threads too); one route is active at a time and phases switch it.

Typical loop (the same code runs the ``cuda`` preset, which is a pass-through)::

    with UnifiedMemory("hpcmem", device=0) as um:
        with um.params():
            model = build().to("cuda")
        um.attach(model, optimizer)          # grads, lazy optimizer state -> params pool
        for batch in batches:
            x = um.stage(batch)               # inputs pool, written by the CPU
            with um.activations():            # forward + backward, all threads
                loss = model(x).sum()
                loss.backward()
            optimizer.step()                  # routed to the params pool by a hook
            optimizer.zero_grad(set_to_none=False)
        print(um.stats())
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpcmem.um import guard
from hpcmem.um.budget import plan_budget
from hpcmem.um.native import ACCESS_BITS, LOCATION_IDS, TYPE_IDS, load_native, require_cuda
from hpcmem.um.policy import TYPES, Policy, load_policy
from hpcmem.um.prefetch import PrefetchHooks

__all__ = ["UnifiedMemory"]

_open_lock = threading.Lock()
#: the open instance, weakly: a closed one must be free to die and give its pools back
_open_instance: weakref.ref[UnifiedMemory] | None = None


class UnifiedMemory:
    """Per-type Unified Memory for one training job on one GPU.

    Parameters
    ----------
    policy : a preset name (``cuda``, ``um``, ``hpcmem``), a YAML path or a :class:`Policy`.
    device : CUDA device ordinal.
    gpu_budget : GPU-resident bytes for the whole job (None: no budget).
    allow_oversubscription : let managed bytes exceed free device memory (dedicated nodes only).
    headroom_bytes : bytes the guard keeps free (default: 5% of the device, at least 1 GiB).
    """

    def __init__(
        self,
        policy: str | Path | Policy,
        device: int = 0,
        gpu_budget: int | None = None,
        allow_oversubscription: bool = False,
        headroom_bytes: int | None = None,
    ) -> None:
        self.policy = load_policy(policy)
        if gpu_budget is not None and gpu_budget <= 0:
            raise ValueError(f"gpu_budget: {gpu_budget} bytes must be positive")
        if gpu_budget is not None and not self.policy.managed:
            raise ValueError(
                f"gpu_budget: needs a managed policy; {self.policy.name!r} is PyTorch's allocator"
            )
        self.gpu_budget = gpu_budget
        self.allow_oversubscription = guard.oversubscription_allowed(allow_oversubscription)
        self._route_stack: list[str] = []
        self._pools: dict[str, Any] = {}
        self._params: list[Any] = []
        self._hooks: list[Any] = []
        self._prefetch: PrefetchHooks | None = None
        self._rebalanced = False
        self._closed = False
        self._native: Any = None
        self._limit: int | None = None
        torch = _torch_for(self.policy)
        self._torch = torch
        self.device = torch.device("cuda", device) if torch is not None else None
        if not self.policy.managed:
            return
        self._native = load_native()
        free, total = torch.cuda.mem_get_info(self.device)
        self.device_total_bytes = total
        headroom = guard.default_headroom(total) if headroom_bytes is None else headroom_bytes
        self._limit = guard.managed_limit(free, headroom, self.allow_oversubscription)
        self._claim()
        self._configure_native()
        from torch.cuda.memory import CUDAPluggableAllocator, MemPool

        path = self._native.library_path()
        for type_name in TYPES:
            allocator = CUDAPluggableAllocator(
                path, f"hpcmem_um_malloc_{type_name}", f"hpcmem_um_free_{type_name}"
            )
            self._pools[type_name] = MemPool(allocator.allocator())
        self._reserved_baseline = torch.cuda.memory_reserved(self.device) - self._leftover_bytes

    # -- set-up -------------------------------------------------------------------------
    def _claim(self) -> None:
        global _open_instance
        with _open_lock:
            current = _open_instance() if _open_instance is not None else None
            if current is not None and not current._closed:
                raise RuntimeError(
                    "another UnifiedMemory is open in this process: close() it first "
                    "(the native allocator's policies and counters are process-wide)"
                )
            _open_instance = weakref.ref(self)

    def _configure_native(self) -> None:
        um = self._native
        um.reset_counters()
        self._epoch = um.begin_epoch()
        # Segments an earlier job left alive (its tensors still referenced) are not ours: the
        # free memory the limit came from already excludes them, and so does the budget.
        self._baseline = {t: um.counters(TYPE_IDS[t]) for t in TYPES}
        self._leftover_bytes = um.managed_bytes()
        leftover_gpu = sum(c["gpu_bytes"] for c in self._baseline.values())
        um.set_limit(um.UNLIMITED if self._limit is None else self._limit + self._leftover_bytes)
        um.set_gpu_budget(
            um.UNLIMITED if self.gpu_budget is None else self.gpu_budget + leftover_gpu
        )
        for type_name in TYPES:
            tp = self.policy.type_policy(type_name)
            um.set_policy(
                TYPE_IDS[type_name],
                LOCATION_IDS[tp.preferred_location],
                sum(ACCESS_BITS[a] for a in tp.accessed_by),
                tp.read_mostly,
                tp.prefetch == "on_alloc",
            )
            um.set_gpu_quota(TYPE_IDS[type_name], um.UNLIMITED)

    @property
    def managed(self) -> bool:
        """Whether this job uses Unified Memory (False for the ``cuda`` pass-through)."""
        return self.policy.managed

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
            raise RuntimeError("this UnifiedMemory is closed")
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
        if not self.managed:
            yield
            return
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

    def params(self):
        """Context: model construction, ``.to(device)``, gradients, optimizer state."""
        return self._route("params")

    def activations(self):
        """Context: forward and backward; every allocation of every thread is routed.

        Parameters of an attached model that have no gradient get a persistent one in the
        params pool first, so gradients never land among the activations.
        """
        if self.managed and self._params:
            self._ensure_grads()
        return self._route("activations")

    def inputs(self):
        """Context: input batches produced on the CPU."""
        return self._route("inputs")

    def _ensure_grads(self) -> None:
        missing = [p for p in self._params if p.requires_grad and p.grad is None]
        if missing:
            with self._route("params"):
                for param in missing:
                    param.grad = self._torch.zeros_like(param)

    # -- model and optimizer ----------------------------------------------------------
    def attach(self, model: Any, optimizer: Any | None = None) -> None:
        """Hook a model and its optimizer into the pools.

        Gradients are allocated persistently in the params pool; ``optimizer.step`` runs in
        the params phase (optimizer state made lazily at the first step lands there); with a
        ``before_use`` params policy, module hooks prefetch the next layers on a side stream.
        With a GPU budget, placement is re-planned from measured demand after the first step.
        """
        if not self.managed:
            return
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
        if self.gpu_budget is not None and not self._rebalanced:
            self.rebalance()

    def rebalance(self) -> dict[str, int]:
        """Re-plan the GPU budget from each type's measured peak bytes; returns the quotas.

        Segments whose placement changes are re-advised and moved (prefetch) on the current
        stream, lowest priority first so that room is freed before it is taken.
        """
        if self.gpu_budget is None:
            raise RuntimeError("rebalance: this UnifiedMemory has no gpu_budget")
        um = self._native
        demand = {t: self._counters(t)["peak_bytes"] for t in TYPES}
        wants = {t: self.policy.type_policy(t).wants_gpu() for t in TYPES}
        quotas = plan_budget(self.gpu_budget, self.policy.priority, demand, wants)
        stream = self._torch.cuda.current_stream(self.device).cuda_stream
        for type_name in reversed(self.policy.priority):
            leftover = self._baseline[type_name]["gpu_bytes"]
            um.set_gpu_quota(TYPE_IDS[type_name], quotas[type_name] + leftover)
            um.replace(TYPE_IDS[type_name], self._epoch, self.device.index, stream)
        self._rebalanced = True
        if self._prefetch is not None:
            self._prefetch.refresh()
        return quotas

    # -- inputs -----------------------------------------------------------------------
    def stage(self, batch: Any) -> Any:
        """A CPU tensor's copy on the device: in the inputs pool, written by the CPU.

        With a managed policy the CPU writes the batch straight into managed memory (after
        the stream is done with the block's previous use); a ``before_use`` inputs policy then
        prefetches it to the GPU. The ``cuda`` pass-through copies host to device.
        """
        if not self.managed:
            return batch.to(self.device, non_blocking=batch.is_pinned())
        torch = self._torch
        with self.inputs():
            out = torch.empty(batch.shape, dtype=batch.dtype, device=self.device)
        torch.cuda.current_stream(self.device).synchronize()
        host_view(out).copy_(batch)
        if self.policy.inputs.prefetch == "before_use":
            self.prefetch(out)
        return out

    def _prefetch_to_gpu(self, ptr: int, nbytes: int, stream: int) -> None:
        self._native.prefetch(ptr, nbytes, self.device.index, stream, TYPE_IDS["params"])

    def segments(self, type_name: str) -> list[tuple[int, int, bool]]:
        """This job's live segments of a type: ``(address, bytes, placed on the GPU)``."""
        if not self.managed:
            return []
        return [
            (ptr, size, on_gpu)
            for ptr, size, on_gpu, epoch in self._native.segments(TYPE_IDS[type_name])
            if epoch == self._epoch
        ]

    def prefetch(self, tensor: Any, to: str = "gpu") -> None:
        """Prefetch a managed tensor's pages to ``gpu`` or ``cpu`` on the current stream."""
        if not self.managed:
            return
        if to not in ("gpu", "cpu"):
            raise ValueError(f"to: {to!r} is not one of gpu, cpu")
        location = self.device.index if to == "gpu" else self._native.CPU_ID
        stream = self._torch.cuda.current_stream(self.device).cuda_stream
        nbytes = tensor.numel() * tensor.element_size()
        self._native.prefetch(tensor.data_ptr(), nbytes, location, stream)

    # -- guard --------------------------------------------------------------------------
    @property
    def limit_bytes(self) -> int | None:
        """The guard's limit on managed bytes (None: oversubscription allowed or cuda)."""
        return self._limit

    def check_request(self, nbytes: int) -> None:
        """Raise the guard's error now if ``nbytes`` more managed memory would pass the limit."""
        if self.managed:
            guard.check_request(nbytes, self._managed_bytes(), self._limit)

    def _refusals(self) -> int:
        return sum(self._native.counters(i)["refusals"] for i in TYPE_IDS.values())

    def _guard_message(self, type_name: str) -> str:
        um = self._native
        refused = um.counters(TYPE_IDS[type_name])["last_refused_bytes"]
        return guard.refusal_message(refused, self._managed_bytes(), self._limit or 0)

    def _managed_bytes(self) -> int:
        # This job's managed bytes (segments earlier jobs left alive excluded).
        return max(0, self._native.managed_bytes() - self._leftover_bytes)

    # -- statistics ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-type counters, managed and GPU-resident bytes, and bytes that escaped the pools.

        ``escaped_bytes`` is what PyTorch reserved on the device since this object was made
        beyond the managed segments of the three pools: memory no type accounts for.
        """
        if not self.managed:
            return {
                "policy": self.policy.name,
                "managed": False,
                "escaped_bytes": None,
                **{t: None for t in TYPES},
            }
        types = {t: self._counters(t) for t in TYPES}
        managed = self._managed_bytes()
        reserved = self._torch.cuda.memory_reserved(self.device) - self._leftover_bytes
        return {
            "policy": self.policy.name,
            "managed": True,
            **types,
            "managed_bytes": managed,
            "gpu_resident_bytes": sum(c["gpu_bytes"] for c in types.values()),
            "gpu_budget_bytes": self.gpu_budget,
            "limit_bytes": self._limit,
            "device_total_bytes": self.device_total_bytes,
            "escaped_bytes": max(0, reserved - managed - self._reserved_baseline),
        }

    def _counters(self, type_name: str) -> dict[str, int]:
        # Live, peak, segment and GPU bytes net of what earlier jobs left alive.
        counters = self._native.counters(TYPE_IDS[type_name])
        base = self._baseline[type_name]
        for key in ("live_bytes", "peak_bytes", "segments", "gpu_bytes"):
            counters[key] = max(0, counters[key] - base[key])
        return counters

    def reset_stats(self) -> None:
        """Peaks to current; advice, prefetch and refusal counts to zero (e.g. after warm-up)."""
        if self.managed:
            self._native.reset_counters()
            self._reserved_baseline = (
                self._torch.cuda.memory_reserved(self.device) - self._native.managed_bytes()
            )

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """End routing and remove hooks. Pools stay alive until their tensors are freed."""
        if self._closed:
            return
        while self._route_stack:
            self._exit()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._prefetch is not None:
            self._prefetch.remove()
        self._params = []
        self._closed = True

    def __enter__(self) -> UnifiedMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _torch_for(policy: Policy):
    if policy.managed:
        return require_cuda(policy.name)
    try:
        import torch
    except ImportError as error:
        raise RuntimeError("the cuda policy needs PyTorch: pip install 'torch>=2.8'") from error
    return torch


def host_view(tensor: Any) -> Any:
    """A CPU tensor aliasing a contiguous managed CUDA tensor's memory (for CPU writes)."""
    import numpy as np
    import torch

    if not tensor.is_contiguous():
        raise ValueError("host_view: the tensor must be contiguous")
    nbytes = tensor.numel() * tensor.element_size()
    raw = (ctypes.c_uint8 * nbytes).from_address(tensor.data_ptr())
    return torch.from_numpy(np.ctypeslib.as_array(raw)).view(tensor.dtype).view(tensor.shape)
