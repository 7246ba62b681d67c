"""Where the ranks of a collectives point run: how many nodes, how many tasks on each.

The sweep's ``nodes`` and ``tasks_per_node`` axes give every point a :class:`Layout`; a
point names its ``nodes`` and ``ranks`` (its folder: :mod:`hpcmem.collectives.spec`), and
its layout gives the launcher's options and the Slurm executor's resources.

>>> Layout.spread(nodes=2, ranks=8)
Layout(nodes=2, tasks_per_node=4)
>>> Layout(2, 4).launch_options("srun"), Layout(1, 4).launch_options("srun")
(['--nodes=2', '--ntasks-per-node=4', '--ntasks=8'], ['-n', '4'])
>>> Layout(1, 1).slurm_resources()
{'nodes': 1, 'tasks_per_node': 2}
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from hpcmem.errors import HpcmemError

__all__ = ["Layout", "LayoutError"]


class LayoutError(HpcmemError, ValueError):
    """A sweep whose layouts cannot run; the message names the field, value and what is accepted."""


@dataclass(frozen=True)
class Layout:
    """``nodes`` nodes with ``tasks_per_node`` MPI ranks on each."""

    nodes: int
    tasks_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    @classmethod
    def spread(cls, *, nodes: int, ranks: int) -> Layout:
        """``ranks`` spread evenly over ``nodes`` (a point's coordinates)."""
        if nodes < 1 or ranks < 1 or ranks % nodes:
            raise LayoutError(f"ranks={ranks}, nodes={nodes}: the ranks do not fill the nodes "
                              "evenly (ranks = nodes x tasks per node)")
        return cls(nodes, ranks // nodes)

    def launch_options(self, mpi: str) -> list[str]:
        """Options of the launcher ``mpi`` (the rule's ``mpi`` resource) that start this
        layout's ranks: ``-n R`` on one node; on several, srun gets nodes and tasks per node,
        mpirun/mpiexec Open MPI's ``--map-by ppr:T:node``."""
        if self.nodes == 1:
            return ["-n", str(self.ranks)]
        launcher = os.path.basename(shlex.split(mpi)[0]) if mpi.strip() else ""
        if launcher == "srun":
            return [f"--nodes={self.nodes}", f"--ntasks-per-node={self.tasks_per_node}",
                    f"--ntasks={self.ranks}"]
        return ["-n", str(self.ranks), "--map-by", f"ppr:{self.tasks_per_node}:node"]

    def slurm_resources(self) -> dict[str, int]:
        """``nodes`` and ``tasks_per_node`` of the Slurm executor plugin. It takes tasks per
        node only above 1 for an MPI job (and ``tasks`` never together with it): one rank per
        node asks for 2. Every point asks the same way, so the job of several grouped points
        (their largest of each) holds every one of them."""
        return {"nodes": self.nodes, "tasks_per_node": max(self.tasks_per_node, 2)}

