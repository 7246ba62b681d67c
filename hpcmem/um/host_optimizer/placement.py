"""What the host-optimizer mode puts on the device at set-up.

Each bucket's working weights are one flat buffer of plain device memory, of which every
trained parameter's ``.data`` is a view; the parameters the optimizer does not train and
the module buffers are copied to the device as they are. Beside them, the fixed buffers
every copied byte crosses (:mod:`.staging`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from hpcmem.um.budget.offload import staging_bytes
from hpcmem.um.budget.transport import Transport
from hpcmem.um.host_optimizer.buckets import Bucket
from hpcmem.um.host_optimizer.host import HostBuckets
from hpcmem.um.host_optimizer.staging import OutRing

__all__ = ["PlainMemory", "device_buffers", "place_model"]


class PlainMemory:
    """Allocations in plain device memory on ``device`` (``scope()`` takes them out of every
    pool), their bytes added to ``bytes``."""

    def __init__(self, device: Any, scope: Callable[[], AbstractContextManager[None]]) -> None:
        self.device, self.scope, self.bytes = device, scope, 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        import torch

        on_gpu = self.device.type == "cuda"
        with self.scope():
            before = torch.cuda.memory_reserved(self.device) if on_gpu else 0
            yield
            self.bytes += (torch.cuda.memory_reserved(self.device) if on_gpu else 0) - before


def device_buffers(buckets: list[Bucket], host: HostBuckets, working_dtype: Any,
                   transport: Transport, budget: int, ring: bool = True
                   ) -> tuple[list[Any], OutRing | None, Any]:
    """Each bucket's flat working weights (filled by the uploads), the out ring in the
    dtype gradients leave in (None without ``ring``: data parallelism reduces them first,
    :mod:`.exchange`), and the fp32 buffer uploads narrow through (None when the host
    uploads the working dtype)."""
    import torch

    device = transport.device
    ring_bytes, through_bytes = staging_bytes(budget)
    flats = [torch.empty(b.numel, dtype=working_dtype, device=device) for b in buckets]
    through = None
    if host.upload_source(0).dtype != working_dtype:
        through = torch.empty(through_bytes // 4, dtype=torch.float32, device=device)
    wire = host.kernel.grad_dtype
    out = OutRing(transport, ring_bytes // wire.itemsize, wire) if ring else None
    return flats, out, through


def place_model(model: Any, buckets: list[Bucket], flats: list[Any], working_dtype: Any,
                device: Any) -> list[Any]:
    """Trained parameters become views of their bucket's flat buffer; the other floating
    parameters are copied in ``working_dtype``, the rest and the buffers as they are. The
    copies (what is not trained)."""
    bucketed, copies = set(), []
    for bucket, flat in zip(buckets, flats, strict=True):
        for position, param in enumerate(bucket.params):
            param.grad = None
            param.data = bucket.slot(flat, position)
            bucketed.add(id(param))
    for param in {id(p): p for p in model.parameters()}.values():
        if id(param) not in bucketed:
            dtype = working_dtype if param.is_floating_point() else param.dtype
            param.grad = None
            param.data = _device_copy(param.data, dtype, device)
            copies.append(param.data)
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = _device_copy(buffer, buffer.dtype, device)
                copies.append(module._buffers[name])
    return copies


def _device_copy(tensor: Any, dtype: Any, device: Any) -> Any:
    import torch

    out = torch.empty(tensor.shape, dtype=dtype, device=device)
    out.copy_(tensor)
    return out
