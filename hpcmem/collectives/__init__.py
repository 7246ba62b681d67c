"""OSU-compatible mpi4py collectives benchmark on NumPy, memkind (HBW) and MPI buffers.

``run(comm, options, emit)`` checks, times and records every (op, buffer kind,
size) point of the :class:`Options` that ``make_options`` validates; ``OPS`` is the
registry of collectives, ``BUFFER_KINDS`` the buffer kinds. ``spec`` declares the
records' coordinates and metrics for the results pipeline, with ``tables`` and
``report``. The command line is ``hpcmem collectives`` (:mod:`hpcmem.cli.collectives`).
"""

from hpcmem.collectives.benchmark import exit_code, run
from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES, OPS
from hpcmem.collectives.options import Options, make_options

__all__ = ["BUFFER_KINDS", "DTYPES", "OPS", "Options", "exit_code", "make_options", "run"]
