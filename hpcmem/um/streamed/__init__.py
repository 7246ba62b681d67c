"""The streamed budget strategy: train within ``gpu_budget`` bytes of GPU memory at PCIe speed.

What does not fit the budget lives in pinned host memory and crosses PCIe around its use,
at most once each way per step, overlapped with compute: parameters layer by layer ahead of
use, saved activations out after their forward and back before their backward (or
recomputed), gradients home as soon as they are complete, the optimizer step chunk by chunk
(:class:`Streamer`; the shared parts in :mod:`hpcmem.um.budget`).
"""

from hpcmem.um.streamed.engine import Streamer
from hpcmem.um.streamed.plan import Probe, StreamPlan, plan_stream

__all__ = ["Probe", "StreamPlan", "Streamer", "plan_stream"]
