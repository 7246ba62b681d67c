"""Other work on the ranks' CPUs while a run measures: marks taken by every rank.

Every rank gives its own CPU time at each mark; rank 0 takes the CPUs' busy time from
:class:`hpcmem.node.state.BusyCpus` and makes the ``node`` field of a point from it. Before
the first point the ranks sleep for a moment while rank 0 measures how busy their CPUs are
(:meth:`NodeWatch.crowded`): when the ranks outnumber the free ones, it says so.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from hpcmem.node.state import SHARED_SLACK, YIELD_ENV, BusyCpus, node_state, yield_when_idle

__all__ = ["IDLE_PROBE_SECONDS", "NodeWatch"]

#: how long every rank sleeps while rank 0 measures the other work on their CPUs
IDLE_PROBE_SECONDS = 0.2


@dataclass(frozen=True)
class NodeWatch:
    """The other work on ``cpus`` while ``ranks`` measure there (``busy``: rank 0 only)."""

    cpus: tuple[int, ...]  # the CPUs any rank may run on
    ranks: int
    busy: BusyCpus | None

    @classmethod
    def start(cls, comm: Any, cpus: tuple[int, ...]) -> NodeWatch:
        """A watch over ``cpus`` for the ranks of ``comm``."""
        ranks = comm.Get_size()
        return cls(cpus, ranks, BusyCpus(cpus, ranks) if comm.Get_rank() == 0 else None)

    def mark(self, comm: Any, load_before: list[float] | None = None) -> dict[str, Any] | None:
        """A mark (every rank's CPU time gathered); on rank 0 the ``node`` field of a point
        measured since ``load_before`` was read."""
        own = comm.gather(time.process_time(), root=0)
        if self.busy is None:
            return None
        other = self.busy.mark(sum(own))
        return node_state(self.cpus, self.ranks, load_before=load_before, other_busy_cpus=other)

    def crowded(self, comm: Any) -> bool:
        """Whether the ranks outnumber their CPUs not busy with other work, measured while
        every rank sleeps for a moment; rank 0 says so on stderr before anything is timed."""
        comm.Barrier()
        self.mark(comm)
        time.sleep(IDLE_PROBE_SECONDS)
        node = self.mark(comm)
        if node is None:
            return False
        other = node["other_busy_cpus"]
        if other is None or self.ranks <= len(self.cpus) - other + SHARED_SLACK:
            return False
        waiting = ("they yield the CPU while waiting" if yield_when_idle()
                   else f"busy-polling ranks wait for a time slice: set {YIELD_ENV}=1 "
                   "(collectives.yield_when_idle) on shared nodes")
        note = (f"{self.ranks} ranks on {len(self.cpus)} CPUs, {other:.1f} of them busy with "
                f"other work: ranks share cores, latencies include waiting ({waiting})")
        print(f"hpcmem collectives: warning: {note}", file=sys.stderr, flush=True)
        return True
