"""The host-optimizer budget strategy (ZeRO-Offload class): working weights on the GPU, fp32
master weights and optimizer state in host memory, the optimizer stepped on the CPU bucket
by bucket while backward goes on (:class:`HostOptimizer`; the shared parts in
:mod:`hpcmem.um.budget`).
"""

from hpcmem.um.host_optimizer.buckets import Bucket, lay_out
from hpcmem.um.host_optimizer.cores import optimizer_cpus
from hpcmem.um.host_optimizer.engine import HostOptimizer
from hpcmem.um.host_optimizer.ledger import step_bound_ms

__all__ = ["Bucket", "HostOptimizer", "lay_out", "optimizer_cpus", "step_bound_ms"]
