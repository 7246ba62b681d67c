"""The primitives the budget strategies are built from, measured on this GPU (JSON out).

Usage: python benchmarks/gpu/primitives.py OUT.json

* pinned ``cudaMemcpyAsync`` host to device, device to host, and both at once;
* managed memory (2 GiB, well inside free device memory): ``cudaMemPrefetchAsync`` to the GPU
  and back to the CPU, a read-mostly range prefetched to the GPU and its GPU copy dropped by
  clearing read-mostly (with the device's free memory before and after), and
  ``cudaMemcpyAsync`` from host-resident managed pages to device memory;
* AdamW on the CPU (fused, fp32), for an optimizer step on the host;
* per repeated block of the benchmark's 0.35B transformer (bf16, 16 x 1024 tokens) and of
  ResNet-50 (fp32, batch 256): forward time against the bytes it saves for backward, i.e.
  recomputing against fetching back over PCIe.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

GiB = 2**30


def _seconds(work: Any, repeats: int = 3) -> float:
    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        work()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def pinned(nbytes: int = GiB) -> dict[str, float]:
    import torch

    host_in = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host_out = torch.empty_like(host_in, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device_in = torch.empty_like(device)
    h2d, d2h = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(h2d):
            device_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(d2h):
            host_out.copy_(device, non_blocking=True)

    return {
        "h2d_GBps": nbytes / _seconds(lambda: device.copy_(host_in, non_blocking=True)) / 1e9,
        "d2h_GBps": nbytes / _seconds(lambda: host_out.copy_(device, non_blocking=True)) / 1e9,
        "both_each_way_GBps": nbytes / _seconds(both) / 1e9,
    }


def managed(nbytes: int = 2 * GiB) -> dict[str, Any]:
    import torch

    from hpcmem import _um
    from hpcmem.um import UnifiedMemory, host_view

    out: dict[str, Any] = {"bytes": nbytes}
    with UnifiedMemory("um", device=0) as um:
        with um.activations():
            buffer = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        pointer = buffer.data_ptr()
        stream = torch.cuda.current_stream().cuda_stream
        host = host_view(buffer)
        host.fill_(1)  # pages on the CPU

        def to(location: int) -> None:
            _um.prefetch(pointer, nbytes, location, stream)

        out["prefetch_h2d_GBps"] = nbytes / _seconds(lambda: to(0), 1) / 1e9
        out["prefetch_d2h_GBps"] = nbytes / _seconds(lambda: to(_um.CPU_ID), 1) / 1e9
        target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # PyTorch's own

        def copy() -> None:
            target.copy_(buffer, non_blocking=True)

        out["memcpy_from_host_managed_GBps"] = nbytes / _seconds(copy, 1) / 1e9
        to(_um.CPU_ID)
        torch.cuda.synchronize()
        _um.advise(pointer, nbytes, 0, _um.LOC_CPU, 0, True)  # preferred CPU, read-mostly
        free_before = torch.cuda.mem_get_info()[0]
        out["read_mostly_h2d_GBps"] = nbytes / _seconds(lambda: to(0), 1) / 1e9
        free_duplicated = torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        _um.advise(pointer, nbytes, 0, _um.LOC_CPU, 0, False)  # collapse to the CPU copy
        torch.cuda.synchronize()
        out["read_mostly_drop_ms"] = (time.perf_counter() - start) * 1e3
        free_dropped = torch.cuda.mem_get_info()[0]
        out["read_mostly_gpu_bytes_after_prefetch"] = free_before - free_duplicated
        out["read_mostly_gpu_bytes_after_drop"] = free_before - free_dropped
    return out


def cpu_adamw(count: int = 64 * 2**20) -> dict[str, float]:
    import torch

    params = [torch.zeros(count, requires_grad=True)]
    params[0].grad = torch.ones(count)
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    optimizer.step()
    start = time.perf_counter()
    for _ in range(3):
        optimizer.step()
    seconds = (time.perf_counter() - start) / 3
    return {"params": count, "ms": seconds * 1e3, "ms_per_100M_params": seconds * 1e3 * 1e8 / count,
            "threads": torch.get_num_threads()}


def block_costs(block: Any, x: Any, autocast: bool, bandwidth: float) -> dict[str, float]:
    """Forward ms of ``block`` on ``x`` against the bytes its forward saves for backward."""
    import torch

    storages: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    context = torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        block(x).sum().backward()
    weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved = sum(n for pointer, n in storages.items() if pointer not in weights)
    times = []
    with torch.no_grad(), context:
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            block(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    forward = statistics.median(times)
    fetch = saved / bandwidth * 1e3
    return {"forward_ms": forward, "saved_bytes": saved, "fetch_back_ms": fetch,
            "cheaper": "recompute" if forward < fetch else "offload"}


def blocks(bandwidth: float) -> dict[str, Any]:
    import torch

    from hpcmem.train import networks
    from hpcmem.train.models import CNNShape, transformer_shape

    torch.manual_seed(0)
    shape = transformer_shape(350_000_000, 1024)
    block = networks._Block(shape.d_model, shape.n_heads).cuda()
    x = torch.randn(16, 1024, shape.d_model, device="cuda", requires_grad=True)
    result = {"transformer_0.35B": block_costs(block, x, True, bandwidth)}
    cnn = CNNShape()
    width, _, _ = cnn.stages()[0]
    bottleneck = networks._Bottleneck(4 * width, width, 1).cuda()
    images = torch.randn(256, 4 * width, 56, 56, device="cuda", requires_grad=True)
    result["resnet50_stage1"] = block_costs(bottleneck, images, False, bandwidth)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    result: dict[str, Any] = {"pinned": pinned()}
    result["managed"] = managed()
    result["cpu_adamw"] = cpu_adamw()
    result["blocks"] = blocks(result["pinned"]["h2d_GBps"] * 1e9)
    with open(argv[0], "w") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
