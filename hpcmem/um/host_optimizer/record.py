"""What the host-optimizer strategy (an :class:`~hpcmem.um.host_optimizer.HostOptimizer`,
``engine`` below) says of itself: its per-step record, and the make-up of its floor where a
budget is refused."""

from __future__ import annotations

from typing import Any

from hpcmem.um.budget.floor import describe_floor

__all__ = ["floor_detail", "record"]


def record(engine: Any) -> dict[str, Any]:
    """Per step: bytes each way and busy time, compute and CPU optimizer time, the bound;
    what the device and the host hold; how the step ran."""
    transport = engine.transport
    return {
        "strategy": "host_optimizer",
        "phase": engine.phase.value,
        **engine.ledger.per_step(),
        "probe_bytes": engine.probe_bytes,
        "peak_allocated_bytes": max(0, transport.peak_bytes() - engine._base_bytes),
        "peak_gpu_resident_bytes": transport.resident_peak_bytes()
        + max(engine.outside_bytes, transport.outside_bytes()),
        "outside_bytes": engine.outside_bytes,
        "plain_bytes": engine.plain_bytes,
        "working_bytes": engine.working_bytes,
        "working_dtype": str(engine.working_dtype).removeprefix("torch."),
        "buckets": len(engine.buckets),
        "host_kernel": engine.host.kernel.name,
        "state_dtype": str(engine.host.kernel.state_dtype).removeprefix("torch."),
        "host_threads": engine.worker.threads or engine._torch.get_num_threads(),
        "host_cpus": engine.worker.cpus,
        "recompute": engine.recompute.enabled,
        "recomputed_blocks": engine.recompute.recomputed,
        "micro_batches": engine.offload.micro_batches,
        "micro_batch_sums": "host" if engine.micro_sums else "device",
        "delayed_update": engine._delayed,
        "split": engine.split.to_record() if engine.split is not None else None,
        "host_bytes": engine.arena.reserved_bytes,
        "host_memory": {**(engine.arena.placement() or {"kind": engine.arena.kind}),
                        "gpu_numa_node": engine.gpu_node},
        "host_optimizer_bytes": engine.host.held_bytes(),
        "clip": engine.clip.to_record() if engine.clip else None,
        **(engine.exchange.stats(engine.ledger.steps) if engine.exchange else
           {"world_size": 1, "bytes_communicated": 0}),
    }


def floor_detail(engine: Any) -> str:
    """What makes up the probe's floor, and what is off the device already."""
    working = engine.working_bytes
    split = engine.batch_split
    measured = split is not None and split.token_bytes is not None
    grads = split.measure.grad_bytes if measured and split.floor_split else 0
    on_host = measured and split.measure.host_sums is not None
    return describe_floor(
        {"working weights": working, "copies' buffers": max(0, engine.plain_bytes - working),
         "a gradient set (the batch split)": 0 if on_host else grads},
        split.token_bytes if measured else None, engine.recompute,
        {"fp32 masters and optimizer state on the host": engine.host.held_bytes(),
         **({"the split's gradient sums to the host": grads} if on_host and grads else {})},
        split.parts if split is not None else 1)
