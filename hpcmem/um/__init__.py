"""Unified Memory for PyTorch training: per-type memory advice, prefetch, GPU budget, guard.

Importing this package needs neither torch nor CUDA; :func:`UnifiedMemory` with a managed
policy needs a CUDA build of torch, a GPU and the native library (``hpcmem._um``). Every
error it raises is an :class:`hpcmem.errors.HpcmemError`.
"""

from hpcmem.um.budget import (
    BudgetStrategy,
    BudgetTooSmallError,
    HostOptimizerOffload,
    Offload,
    StreamedOffload,
    offload_named,
)
from hpcmem.um.errors import BudgetError, UnifiedMemoryError
from hpcmem.um.guard import (
    ENV_ALLOW,
    check_request,
    default_headroom,
    managed_limit,
    oversubscription_allowed,
)
from hpcmem.um.memory import MemoryScopes
from hpcmem.um.policy import (
    PRESETS,
    TYPES,
    Policy,
    PolicyError,
    TypePolicy,
    load_policy,
    policy_from_dict,
)
from hpcmem.um.tensors import host_view
from hpcmem.um.unified import UnifiedMemory

__all__ = [
    "ENV_ALLOW",
    "PRESETS",
    "TYPES",
    "BudgetError",
    "BudgetStrategy",
    "BudgetTooSmallError",
    "HostOptimizerOffload",
    "MemoryScopes",
    "Offload",
    "OversubscriptionError",
    "Policy",
    "PolicyError",
    "StreamedOffload",
    "TypePolicy",
    "UnifiedMemory",
    "UnifiedMemoryError",
    "check_request",
    "default_headroom",
    "host_view",
    "load_policy",
    "managed_limit",
    "offload_named",
    "oversubscription_allowed",
    "policy_from_dict",
]


def __getattr__(name: str):
    # A torch.OutOfMemoryError subclass: made when first asked for, so torch stays optional.
    if name == "OversubscriptionError":
        from hpcmem.um import guard

        return guard.OversubscriptionError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
