"""Which CPUs the host optimizer's threads run on, and which stay free for GPU launches.

The step is only as fast as the host threads that launch its GPU work (the training loop's
and autograd's). On an H200 host with 16 cores, the host optimizer's 14 threads, placed
anywhere by the scheduler, slowed those launches enough to leave the GPU idle between
kernels; bound to cores of their own, the same step ran faster
(``docs/gpu-budget.md``). So the optimizer's threads are bound to the job's CPUs less
the first ``LAUNCH_THREADS`` cores (with their hyperthread siblings), which are left to the
launching threads. The job's CPUs are its affinity mask, as Slurm, ``numactl`` or
``taskset`` set it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LAUNCH_THREADS", "optimizer_cpus", "pin_thread"]

#: Cores left to the threads that launch GPU work (the loop's and autograd's).
LAUNCH_THREADS = 2

_SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def _siblings(cpu: int) -> set[int]:
    """The CPUs sharing ``cpu``'s core (itself where the kernel does not say)."""
    try:
        text = Path(_SIBLINGS.format(cpu)).read_text().strip()
    except OSError:
        return {cpu}
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus | {cpu}


def optimizer_cpus(threads: int | None = None, allowed: set[int] | None = None) -> list[int]:
    """CPUs for the host optimizer's ``threads`` (None: one per CPU): ``allowed`` (the job's
    mask) less the first ``LAUNCH_THREADS`` cores; the job's first CPUs where those are too
    few."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    launch: set[int] = set()
    cores = 0
    for cpu in sorted(allowed):
        if cores == LAUNCH_THREADS:
            break
        if cpu not in launch:
            launch |= _siblings(cpu) & allowed
            cores += 1
    free = sorted(allowed - launch) or sorted(allowed)
    if threads is None or threads <= len(free):
        return free[:threads]
    return sorted(allowed)[:threads]


def pin_thread(cpus: list[int]) -> None:
    """Bind the calling thread (and the threads it starts from now on) to ``cpus``."""
    os.sched_setaffinity(0, cpus)
