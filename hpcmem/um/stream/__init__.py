"""The streaming budget mode: train within ``gpu_budget`` bytes of GPU memory at PCIe speed.

What does not fit the budget lives in pinned host memory and crosses PCIe around its use,
at most once each way per step, overlapped with compute: parameters layer by layer ahead of
use, saved activations out after their forward and back before their backward (or
recomputed), gradients home as soon as they are complete, the optimizer step chunk by chunk.
"""

from hpcmem.um.stream.cpu_transport import CpuTransport
from hpcmem.um.stream.engine import Streamer
from hpcmem.um.stream.plan import (
    BudgetTooSmall,
    Probe,
    StreamPlan,
    pcie_transfer_ms,
    plan_stream,
)
from hpcmem.um.stream.transport import CudaTransport, InFlight, Transport

__all__ = [
    "BudgetTooSmall",
    "CpuTransport",
    "CudaTransport",
    "InFlight",
    "Probe",
    "StreamPlan",
    "Streamer",
    "Transport",
    "pcie_transfer_ms",
    "plan_stream",
]
