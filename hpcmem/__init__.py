"""hpcmem: memory placement for deep-learning-scale HPC jobs.

Subpackages and modules are imported on demand so that ``import hpcmem`` needs
neither torch, mpi4py nor CUDA.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
