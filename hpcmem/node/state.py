"""How busy the node was around a measurement: enough to tell "slower" from "disturbed".

:class:`BusyCpus` reads the busy time of the CPUs the measuring processes may run on
(``/proc/stat``, per CPU) at marks during a run. The CPU time the measuring processes spent
themselves (their ``time.process_time()``, summed by the caller) is subtracted: what is left
is the other work that ran on those CPUs meanwhile, in CPUs (1.0: one CPU fully taken by
something else). When the measuring
processes and that other work together need more CPUs than there are, they shared cores:
busy-polling MPI ranks then wait for a time slice, and a 1 µs collective takes
milliseconds. :func:`node_state` is the ``node`` field of every record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SHARED_SLACK",
    "YIELD_ENV",
    "BusyCpus",
    "busy_cpu_seconds",
    "governor",
    "load_average",
    "node_state",
    "yield_when_idle",
]

#: other work (in CPUs) beyond the free CPUs that still counts as "not shared": counters
#: are read in clock ticks, and a shell or a monitoring daemon uses a few per cent
SHARED_SLACK = 0.25
#: Open MPI's switch that makes waiting ranks yield the CPU instead of spinning
YIELD_ENV = "OMPI_MCA_mpi_yield_when_idle"
_STAT = Path("/proc/stat")
_CPUFREQ = "/sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def governor(cpu: int = 0) -> str | None:
    """The cpufreq scaling governor of ``cpu`` (``performance``, ``powersave``...), or None
    where cpufreq is not exposed (virtual machines, containers)."""
    try:
        return Path(_CPUFREQ.format(cpu)).read_text().strip() or None
    except OSError:
        return None


def yield_when_idle() -> bool:
    """Whether Open MPI was told to yield the CPU while waiting (:data:`YIELD_ENV`)."""
    return os.environ.get(YIELD_ENV, "").strip().lower() in ("1", "true", "yes")


def busy_cpu_seconds(cpus: Iterable[int]) -> float | None:
    """Seconds ``cpus`` spent on anything but idle and I/O wait since boot (``/proc/stat``),
    or None where it cannot be read."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    try:
        lines = _STAT.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (
                int(v) for v in (fields + ["0"] * 8)[:8])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class BusyCpus:
    """Other work on ``cpus`` while ``processes`` measure there, over trailing windows.

    Each :meth:`mark` reads the CPUs' busy time and takes the measuring processes' own CPU
    time (their summed ``time.process_time()``); the other work is the difference since the
    newest earlier mark at least ``window`` seconds old (else the first mark): ``/proc/stat``
    counts in clock ticks, so a window of a few milliseconds would say nothing.
    """

    cpus: tuple[int, ...]
    processes: int
    window: float = 1.0
    _marks: list[tuple[float, float, float]] = field(default_factory=list)

    def mark(self, own_cpu_seconds: float) -> float | None:
        """Record a reading; CPUs' worth of other work since the window's start (None for
        the first mark, or where ``/proc/stat`` cannot be read)."""
        busy, now = busy_cpu_seconds(self.cpus), time.monotonic()
        if busy is None:
            return None
        self._marks.append((now, busy, own_cpu_seconds))
        if len(self._marks) == 1:
            return None
        since = next((m for m in reversed(self._marks[:-1]) if now - m[0] >= self.window),
                     self._marks[0])
        wall = now - since[0]
        other = (busy - since[1] - (own_cpu_seconds - since[2])) / wall if wall > 0 else 0.0
        return round(max(0.0, other), 3)


def node_state(cpus: Iterable[int], processes: int, *, load_before: list[float] | None = None,
               other_busy_cpus: float | None = None) -> dict[str, Any]:
    """The ``node`` field of a record (docs/records.md): load before and after, other busy
    CPUs, governor, and whether the ``processes`` shared the ``cpus`` with other work
    (None when that was not measured)."""
    cpus = sorted(set(cpus))
    shared = None
    if other_busy_cpus is not None:
        shared = processes + other_busy_cpus > len(cpus) + SHARED_SLACK
    return {
        "cpus": len(cpus),
        "processes": processes,
        "load_before": load_before,
        "load_after": load_average(),
        "other_busy_cpus": other_busy_cpus,
        "shared_cores": shared,
        "governor": governor(cpus[0]) if cpus else None,
        "yield_when_idle": yield_when_idle(),
    }
