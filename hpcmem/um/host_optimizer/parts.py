"""The parts of a host-optimizer job, made at ``attach``: its buckets, their host side, the
device buffers, the model's place on the device and the worker, the working weights
uploaded (and, under data parallelism, gathered from every rank's shard).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hpcmem.um.budget.host import HostArena
from hpcmem.um.budget.host_memory import chosen_kind, gpu_cpus
from hpcmem.um.budget.offload import HostOptimizerOffload
from hpcmem.um.budget.parallel import Ranks
from hpcmem.um.budget.transport import Transport
from hpcmem.um.errors import BudgetError
from hpcmem.um.host_optimizer.buckets import Bucket, lay_out
from hpcmem.um.host_optimizer.cores import optimizer_cpus
from hpcmem.um.host_optimizer.exchange import ShardExchange, shard_buckets
from hpcmem.um.host_optimizer.host import HostBuckets
from hpcmem.um.host_optimizer.kernel import bucket_kernel
from hpcmem.um.host_optimizer.placement import device_buffers, place_model
from hpcmem.um.host_optimizer.staging import OutRing
from hpcmem.um.host_optimizer.worker import Worker

__all__ = ["Parts", "make_parts"]


@dataclass
class Parts:
    """What :func:`make_parts` made (``ring`` on one rank, ``exchange`` on several)."""

    trained: list[Any]
    working_dtype: Any
    buckets: list[Bucket]
    arena: HostArena
    host: HostBuckets
    flats: list[Any]
    ring: OutRing | None
    exchange: ShardExchange | None
    worker: Worker
    gpu_node: int | None  # the GPU's NUMA node, where known


def make_parts(
    model: Any, optimizer: Any, *, transport: Transport, budget: int,
    offload: HostOptimizerOffload, ranks: Ranks | None,
    device_scope: Callable[[], AbstractContextManager[None]],
    plain: Callable[[], AbstractContextManager[None]],
) -> Parts:
    """The parts of ``model`` and ``optimizer`` trained under ``offload`` (module docstring);
    ``plain()`` counts the device buffers' bytes, ``device_scope()`` routes the model's."""
    import torch

    unique = list({id(p): p for p in model.parameters()}.values())
    group_of = {id(p): g for g, group in enumerate(optimizer.param_groups)
                for p in group["params"]}
    trained = [p for p in reversed(unique) if p.requires_grad and id(p) in group_of]
    if not trained:
        raise BudgetError("offload host_optimizer: the optimizer trains no parameter "
                          "of the model")
    working_dtype = (getattr(torch, offload.working_dtype) if offload.working_dtype
                     else trained[0].dtype)
    buckets = lay_out(trained, [group_of[id(p)] for p in trained], offload.bucket_bytes,
                      working_dtype.itemsize)
    if ranks is not None:
        shard_buckets(ranks, buckets, offload, budget)
    on_gpu = transport.device.type == "cuda"  # on the CPU the model computes there too
    gpu_node = None
    if on_gpu:  # the optimizer's CPUs on the GPU's own NUMA node, the job's mask permitting
        allowed, gpu_node = gpu_cpus(transport.device, set(os.sched_getaffinity(0)))
    cpus = optimizer_cpus(offload.threads, allowed) if on_gpu else None
    threads = offload.threads or (len(cpus) if cpus else None)
    kernel = bucket_kernel(optimizer, working_dtype,
                           threads=threads or torch.get_num_threads(), cpus=cpus,
                           kind=offload.host_kernel,
                           state_dtype=getattr(torch, offload.state_dtype or "float32"))
    arena = HostArena(transport, chosen_kind(offload.host_memory))
    host = HostBuckets(buckets, optimizer, arena=arena, kernel=kernel,
                       grad_sets=2 if offload.delayed_update else 1, ranks=ranks)
    with plain():
        flats, ring, through = device_buffers(buckets, host, working_dtype, transport, budget,
                                              ring=ranks is None)
        exchange = (ShardExchange(ranks, transport, buckets, kernel.grad_dtype)
                    if ranks is not None else None)
    with device_scope():
        rest = place_model(model, buckets, flats, working_dtype, transport.device)
    shards = [flat[start:end] for flat, (start, end) in zip(flats, host.ranges, strict=True)]
    worker = Worker(host, shards, transport, through, threads, cpus)
    for bucket in buckets:
        worker.upload(bucket.index, transport.mark())
    transport.synchronize()
    if exchange is not None:  # every rank's shards; the rest as rank 0 has it (as DDP starts)
        exchange.gather(worker, flats)
        exchange.bytes = 0
        ranks.broadcast(rest)
    return Parts(trained, working_dtype, buckets, arena, host, flats, ring, exchange, worker,
                 gpu_node)
