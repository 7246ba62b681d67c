"""Loading the native allocator (``hpcmem._um``) and checking that CUDA can run it."""

from __future__ import annotations

from types import ModuleType

__all__ = ["load_native", "require_cuda"]

TYPE_IDS = {"params": 0, "activations": 1, "inputs": 2}
LOCATION_IDS = {"none": 0, "gpu": 1, "cpu": 2}
ACCESS_BITS = {"gpu": 1, "cpu": 2}


def require_cuda(policy_name: str):
    """torch, if it is a CUDA build that sees a GPU; a RuntimeError naming the fix otherwise."""
    try:
        import torch
    except ImportError as error:
        raise RuntimeError(
            f"policy {policy_name!r} needs PyTorch with CUDA: pip install 'torch>=2.8' "
            "(a CUDA build) on a GPU node"
        ) from error
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"policy {policy_name!r} needs Unified Memory on a CUDA GPU, but torch "
            f"{torch.__version__} sees none (a CPU-only build, or no GPU on this node); "
            "run it on a GPU node"
        )
    return torch


def load_native() -> ModuleType:
    """The ``hpcmem._um`` module; a RuntimeError saying how to build it when missing."""
    try:
        from hpcmem import _um
    except ImportError as error:
        raise RuntimeError(
            "hpcmem's Unified Memory library is not built (hpcmem._um is missing): "
            "install the CUDA toolkit so nvcc is on PATH, then rebuild with `make native` "
            f"or `pip install .` ({error})"
        ) from error
    return _um
