"""Loading the native allocator (``hpcmem._um``), its ABI constants, and checking CUDA."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from hpcmem.um.errors import UnifiedMemoryError
from hpcmem.um.policy import ACCESSORS, LOCATIONS, TYPES

__all__ = ["Abi", "load_native", "require_cuda"]


@dataclass(frozen=True)
class Abi:
    """The native library's numbering of types, locations and accessors, read from ``_um``."""

    type_ids: dict[str, int]
    location_ids: dict[str, int]
    access_bits: dict[str, int]
    cpu_id: int
    unlimited: int

    @classmethod
    def of(cls, um: ModuleType) -> Abi:
        """The ABI of a loaded ``_um``; a RuntimeError if its types are not the policy's."""
        names = tuple(um.TYPE_NAMES)
        if sorted(names) != sorted(TYPES):
            raise UnifiedMemoryError(
                f"hpcmem._um: types {names} do not match the package's {TYPES}: "
                "rebuild the native library (`make native` or `pip install .`)"
            )
        locations = dict(zip(LOCATIONS, (um.LOC_GPU, um.LOC_CPU, um.LOC_NONE), strict=True))
        return cls(
            type_ids={name: index for index, name in enumerate(names)},
            location_ids=locations,
            access_bits={name: locations[name] for name in ACCESSORS},
            cpu_id=um.CPU_ID,
            unlimited=um.UNLIMITED,
        )


def require_cuda(policy_name: str):
    """torch, if it is a CUDA build that sees a GPU; UnifiedMemoryError naming the fix otherwise."""
    try:
        import torch
    except ImportError as error:
        raise UnifiedMemoryError(
            f"policy {policy_name!r} needs PyTorch with CUDA: pip install 'torch>=2.8' "
            "(a CUDA build) on a GPU node"
        ) from error
    if not torch.cuda.is_available():
        raise UnifiedMemoryError(
            f"policy {policy_name!r} needs Unified Memory on a CUDA GPU, but torch "
            f"{torch.__version__} sees none (a CPU-only build, or no GPU on this node); "
            "run it on a GPU node"
        )
    return torch


def load_native() -> ModuleType:
    """The ``hpcmem._um`` module; UnifiedMemoryError saying how to build it when missing."""
    try:
        from hpcmem import _um
    except ImportError as error:
        raise UnifiedMemoryError(
            "hpcmem's Unified Memory library is not built (hpcmem._um is missing): "
            "install the CUDA toolkit so nvcc is on PATH, then rebuild with `make native` "
            f"or `pip install .` ({error})"
        ) from error
    return _um
