"""Where a host-optimizer step's time goes: bytes and busy time each way, compute, the CPU.

Per step: the bytes copied to the device (updated weights) and back (gradients); the
milliseconds each copy stream was busy (CUDA events around each copy, and around the
narrowing of uploaded weights, which runs on the host-to-device stream); the compute
stream's time from the start of forward to the end of backward; the CPU time of the host
optimizer's bucket steps; and the bound those allow, ``max(compute, H2D bytes / H2D rate,
D2H bytes / D2H rate, CPU optimizer time)``, with the rates measured in the same job.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

from hpcmem.um.budget.transport import Transport, pcie_transfer_ms
from hpcmem.um.host_optimizer.worker import Stepped

__all__ = ["Ledger", "StepTimes", "median_times", "step_bound_ms"]


def step_bound_ms(
    compute_ms: float, h2d: float, d2h: float, cpu_ms: float, bandwidth: dict[str, float]
) -> float:
    """The least a step can take when compute, each copy direction and the host optimizer
    overlap perfectly: the slowest of the four."""
    return max(compute_ms, h2d / bandwidth["h2d"] * 1e3, d2h / bandwidth["d2h"] * 1e3, cpu_ms)


class StepTimes(NamedTuple):
    """One step's milliseconds: the compute span, its part from the first gradient on (the
    window in which the CPU can step buckets), and the CPU optimizer's bucket steps."""

    compute_ms: float
    backward_ms: float
    cpu_ms: float


def median_times(times: Sequence[StepTimes]) -> StepTimes:
    """Each field's median over ``times`` (one slow step does not decide a plan)."""
    return StepTimes(*(statistics.median(field) for field in zip(*times, strict=True)))


class Ledger:
    """The host-optimizer mode's counts since the last :meth:`reset`."""

    def __init__(self, transport: Transport, bandwidth: dict[str, float]) -> None:
        self.transport = transport
        self.bandwidth = dict(bandwidth)
        self._spans: list[tuple[Any, Any]] = []
        self.reset()

    def reset(self) -> None:
        """Counts to zero (e.g. after warm-up)."""
        self.h2d = self.d2h = 0
        self.steps = 0
        self.compute_ms = self.backward_ms = self.cpu_ms = 0.0
        self.busy_ms = {"h2d": 0.0, "d2h": 0.0, "cast": 0.0}
        self.transport.busy_ms()

    def computed(self, start: Any, end: Any) -> None:
        """A forward and backward ran on the compute stream between two marks."""
        self._spans.append((start, end))

    def stepped(self, done: Sequence[Stepped], first_grad: Any = None) -> StepTimes:
        """An optimizer step finished with the bucket jobs ``done``; ``first_grad``: the
        mark at the step's first gradient (None: backward is the whole compute)."""
        cpu_ms = sum(job.cpu_ms for job in done)
        compute_ms = 0.0
        for start, end in self._spans:
            self.transport.settle(end)
            compute_ms += self.transport.elapsed_ms(start, end)
        backward_ms = compute_ms
        if first_grad is not None and self._spans:
            backward_ms = self.transport.elapsed_ms(first_grad, self._spans[-1][1])
        self.cpu_ms += cpu_ms
        self.compute_ms += compute_ms
        self.backward_ms += backward_ms
        self._spans = []
        for way, ms in self.transport.busy_ms().items():
            self.busy_ms[way] += ms
        self.steps += 1
        return StepTimes(compute_ms, backward_ms, cpu_ms)

    def per_step(self) -> dict[str, Any]:
        """The counts per step, and the bound."""
        steps = max(1, self.steps)
        h2d, d2h = self.h2d / steps, self.d2h / steps
        compute, cpu = self.compute_ms / steps, self.cpu_ms / steps
        return {
            "steps": self.steps,
            "bytes_h2d": int(h2d),
            "bytes_d2h": int(d2h),
            "pcie_bandwidth": dict(self.bandwidth),
            "pcie_transfer_ms": pcie_transfer_ms(h2d, d2h, self.bandwidth),
            "compute_ms": compute,
            "backward_ms": self.backward_ms / steps,
            "cpu_optimizer_ms": cpu,
            "h2d_busy_ms": (self.busy_ms["h2d"] + self.busy_ms["cast"]) / steps,
            "d2h_busy_ms": self.busy_ms["d2h"] / steps,
            "step_bound_ms": step_bound_ms(compute, h2d, d2h, cpu, self.bandwidth),
        }
