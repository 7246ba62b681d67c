"""What every GPU-budget strategy shares: the offload values, the contract, the transport,
pinned host memory, recomputation, the floor and the phases of a job's steps.

The strategies sit beside this package and never import each other:
:mod:`hpcmem.um.host_optimizer` (the optimizer on the CPU, working weights on the GPU) and
:mod:`hpcmem.um.streamed` (everything in host memory, visiting the GPU around its use).
:mod:`hpcmem.um.strategy` makes the one an :class:`Offload` value names or the plan picks.
"""

from hpcmem.um.budget.cpu_transport import CpuTransport
from hpcmem.um.budget.floor import BudgetTooSmallError
from hpcmem.um.budget.offload import (
    HostOptimizerOffload,
    Offload,
    StreamedOffload,
    offload_named,
)
from hpcmem.um.budget.phases import Phase
from hpcmem.um.budget.protocol import BudgetStrategy
from hpcmem.um.budget.transport import CudaTransport, InFlight, Transport

__all__ = [
    "BudgetStrategy",
    "BudgetTooSmallError",
    "CpuTransport",
    "CudaTransport",
    "HostOptimizerOffload",
    "InFlight",
    "Offload",
    "Phase",
    "StreamedOffload",
    "Transport",
    "offload_named",
]
