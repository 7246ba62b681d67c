"""hpcmem: memory placement for deep-learning-scale HPC jobs.

Subpackages and modules are imported on demand so that ``import hpcmem`` needs
neither torch, mpi4py nor CUDA. Every error hpcmem raises is a :class:`HpcmemError`.
"""

from hpcmem.errors import HpcmemError

__version__ = "0.1.0"

__all__ = ["HpcmemError", "__version__"]
