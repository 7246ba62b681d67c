"""Where the ranks of a collectives point run: how many nodes, how many tasks on each.

The sweep's ``nodes`` and ``tasks_per_node`` axes give every point a :class:`Layout`
(``ranks``, the one-node form of older configurations, stands for ``nodes: [1]`` and
``tasks_per_node: ranks``). A layout names the point's folder (``ranks<R>`` on one node,
``nodes<N>_ranks<R>`` on several), the launcher's options and the Slurm executor's
resources.

>>> Layout(2, 4).folder, Layout.from_folder("nodes2_ranks8")
('nodes2_ranks8', Layout(nodes=2, tasks_per_node=4))
>>> Layout(2, 4).launch_options("srun"), Layout(1, 4).launch_options("srun")
(['--nodes=2', '--ntasks-per-node=4', '--ntasks=8'], ['-n', '4'])
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import HpcmemError

__all__ = ["FOLDER_PATTERN", "Layout", "LayoutError", "sweep_layouts"]

#: the folder of a point's layout, as a wildcard constraint
FOLDER_PATTERN = "(nodes[0-9]+_)?ranks[0-9]+"
_FOLDER = re.compile(r"(?:nodes([0-9]+)_)?ranks([0-9]+)")


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

    @property
    def folder(self) -> str:
        """``ranks<R>`` on one node (the folder points had before there were several),
        ``nodes<N>_ranks<R>`` on more."""
        ranks = f"ranks{self.ranks}"
        return ranks if self.nodes == 1 else f"nodes{self.nodes}_{ranks}"

    @classmethod
    def from_folder(cls, folder: str) -> Layout:
        """The layout a :attr:`folder` names."""
        found = _FOLDER.fullmatch(folder)
        if not found:
            raise LayoutError(f"layout folder {folder!r} is not ranks<R> or nodes<N>_ranks<R>")
        nodes, ranks = int(found[1] or 1), int(found[2])
        if nodes < 1 or ranks % nodes:
            raise LayoutError(f"layout folder {folder!r}: {ranks} ranks do not fill {nodes} "
                              "nodes evenly")
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
        """``nodes`` and the task count of the Slurm executor plugin, which takes either
        ``tasks_per_node`` (more than 1) or ``tasks``, never both (0 leaves one unset)."""
        if self.tasks_per_node > 1:
            return {"nodes": self.nodes, "tasks_per_node": self.tasks_per_node, "tasks": 0}
        return {"nodes": self.nodes, "tasks_per_node": 0, "tasks": self.ranks}


def _counts(sweep: Mapping[str, Any], key: str) -> list[int]:
    values = sweep.get(key)
    if not isinstance(values, list) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise LayoutError(f"config collectives.{key}: {values!r}: a list of whole numbers, "
                          "each at least 1")
    return values


def sweep_layouts(sweep: Mapping[str, Any]) -> list[Layout]:
    """Every layout of the collectives sweep ``sweep`` (the ``collectives`` config):
    ``nodes`` x ``tasks_per_node``, or one node with ``ranks`` tasks where ``ranks`` is set."""
    nodes = _counts(sweep, "nodes")
    if sweep.get("ranks") is not None:
        if nodes != [1]:
            raise LayoutError(
                f"config collectives.ranks: {sweep['ranks']!r} is the one-node form and "
                f"nodes is {nodes!r}: give tasks_per_node instead of ranks "
                "(ranks = nodes x tasks_per_node)")
        per_node = _counts(sweep, "ranks")
    else:
        per_node = _counts(sweep, "tasks_per_node")
    return [Layout(n, t) for n in nodes for t in per_node]
