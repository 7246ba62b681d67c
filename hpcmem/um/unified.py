"""``UnifiedMemory(policy, ...)``: the memory scopes a policy asks for, made by one factory.

The ``cuda`` preset (``allocator: cuda``) gets a
:class:`~hpcmem.um.passthrough.PassThroughMemory`, PyTorch's own allocator with every scope a
no-op; the Unified Memory presets get a :class:`~hpcmem.um.managed.ManagedMemory`. Both are
:class:`~hpcmem.um.memory.MemoryScopes`, the interface a training loop is written against.
"""

from __future__ import annotations

from pathlib import Path

from hpcmem.um.managed import ManagedMemory
from hpcmem.um.memory import MemoryScopes
from hpcmem.um.passthrough import PassThroughMemory
from hpcmem.um.policy import Policy, load_policy

__all__ = ["UnifiedMemory"]


def UnifiedMemory(  # named as what it makes: the constructor users call
    policy: str | Path | Policy,
    device: int = 0,
    gpu_budget: int | str | None = None,
    allow_oversubscription: bool = False,
    headroom_bytes: int | None = None,
) -> MemoryScopes:
    """The memory scopes of one training job on one GPU under ``policy``.

    Parameters
    ----------
    policy : a preset name (``cuda``, ``um``, ``hpcmem``), a YAML path or a :class:`Policy`.
    device : CUDA device ordinal.
    gpu_budget : GPU-resident bytes for the whole job, an integer or a size such as
        ``"24G"`` (None: no budget). What does not fit lives in host memory and is streamed
        to the GPU around its use.
    allow_oversubscription : let managed bytes exceed free device memory (dedicated nodes only).
    headroom_bytes : bytes the guard keeps free (default: 5% of the device, at least 1 GiB).
    """
    loaded = load_policy(policy)
    implementation = ManagedMemory if loaded.managed else PassThroughMemory
    return implementation(loaded, device, gpu_budget=gpu_budget,
                          allow_oversubscription=allow_oversubscription,
                          headroom_bytes=headroom_bytes)
