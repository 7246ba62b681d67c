"""numactl arguments for one MPI rank, from a binding name and the node's topology.

Bindings (the ``bindings`` axis of the collectives sweep):

``none``
    no numactl at all: the launcher's placement stands.
``cores``
    each local rank on its own core (``--physcpubind``), memory local (``--localalloc``).
``hbw``
    the rank's CPUs on one node with CPUs (``--cpunodebind``), memory bound to the
    high-bandwidth nodes nearest it (``--membind``; all of them where the distances are
    unknown); an error when the node has none.
``dram``
    the rank's CPUs on one node with CPUs, memory bound to that node's DRAM.
``interleave``
    the rank's CPUs on one node with CPUs, memory interleaved over every node.
explicit numactl arguments
    for example ``"--cpunodebind=0 --membind=4"``: long options with ``=`` from
    ``--cpunodebind``, ``--physcpubind``, ``--membind``, ``--preferred``,
    ``--interleave`` and ``--localalloc``, each at most once and at most one memory
    policy; every node and CPU must exist here.

Ranks are spread round-robin over the nodes with CPUs (and over the allowed CPUs
for ``cores``) by their local rank on the node.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from hpcmem.errors import HpcmemError
from hpcmem.node.applied import BINDING_ENV, NUMACTL_ENV
from hpcmem.node.idlist import IdListError, format_id_list, parse_id_list
from hpcmem.node.launcher import local_rank
from hpcmem.node.topology import HBWNodes, NumaNode, hbw_nodes, nearest, numa_nodes

__all__ = [
    "BINDINGS",
    "SKIP_ENV",
    "BindingError",
    "BindingUnavailableError",
    "NumactlPlan",
    "plan_binding",
]

#: the built-in binding names
BINDINGS = ("none", "cores", "hbw", "dram", "interleave")
#: set by ``hpcmem bind --skip-unavailable`` when the binding cannot be applied on this node;
#: ``hpcmem collectives`` then records every point as skipped with this reason
SKIP_ENV = "HPCMEM_SKIP_REASON"
_NODE_OPTIONS = ("--cpunodebind", "--membind", "--interleave", "--preferred")
_MEMORY_OPTIONS = ("--membind", "--interleave", "--preferred", "--localalloc")
_OPTIONS = (*_NODE_OPTIONS, "--physcpubind", "--localalloc")


class BindingError(HpcmemError, ValueError):
    """A binding that cannot be applied here; the message names the value and what is accepted."""


class BindingUnavailableError(BindingError):
    """A well-formed binding this node cannot provide (no HBW node, a node or CPU it lacks)."""


@dataclass(frozen=True)
class NumactlPlan:
    """What ``hpcmem bind`` runs for one rank: the binding's name and its numactl arguments."""

    binding: str
    local_rank: int
    args: tuple[str, ...]
    skip_reason: str | None = None  # set: this node cannot provide it; the command runs unbound

    @property
    def command_prefix(self) -> list[str]:
        """``numactl ARGS --`` to put before a command; empty for ``none``."""
        return ["numactl", *self.args, "--"] if self.args else []

    def environment(self) -> dict[str, str]:
        """The variables the bound command gets: the binding's name and numactl arguments
        (read back by :func:`hpcmem.node.applied.current`) and the skip reason, if any."""
        env = {BINDING_ENV: self.binding, NUMACTL_ENV: shlex.join(self.args)}
        if self.skip_reason is not None:
            env[SKIP_ENV] = self.skip_reason
        return env


def _cpu_nodes(nodes: Sequence[NumaNode]) -> list[NumaNode]:
    with_cpus = [n for n in nodes if n.cpus]
    if not with_cpus:
        raise BindingUnavailableError("no NUMA node with CPUs found in /sys/devices/system/node")
    return with_cpus


def _builtin(name: str, rank: int, nodes: Sequence[NumaNode], hbw: HBWNodes) -> list[str]:
    if name == "none":
        return []
    if name == "cores":
        allowed = sorted(os.sched_getaffinity(0))
        return [f"--physcpubind={allowed[rank % len(allowed)]}", "--localalloc"]
    cpu_nodes = _cpu_nodes(nodes)
    home = cpu_nodes[rank % len(cpu_nodes)]
    cpu_node = home.id
    bind_cpus = f"--cpunodebind={cpu_node}"
    if name == "dram":
        return [bind_cpus, f"--membind={cpu_node}"]
    if name == "interleave":
        return [bind_cpus, f"--interleave={format_id_list(n.id for n in nodes)}"]
    if not hbw.nodes:
        raise BindingUnavailableError(
            "binding 'hbw': this node has no high-bandwidth memory node "
            "(declare one for emulation with HPCMEM_HBW_NODES=<nodes>, or use binding dram)"
        )
    return [bind_cpus, f"--membind={format_id_list(nearest(home, hbw.nodes))}"]


def _explicit(text: str, nodes: Sequence[NumaNode]) -> list[str]:
    """Validate explicit numactl arguments strictly; returns them normalised."""
    node_ids = [n.id for n in nodes]
    cpu_ids = sorted(c for n in nodes for c in n.cpus)
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise BindingError(f"binding {text!r}: {error}") from None
    seen: dict[str, str] = {}
    for word in words:
        option, _, value = word.partition("=")
        if option not in _OPTIONS:
            raise BindingError(
                f"binding {text!r}: {word!r} is not one of {', '.join(BINDINGS)} or numactl "
                f"options {', '.join(o + '=...' for o in _OPTIONS[:-1])}, --localalloc"
            )
        if option in seen:
            raise BindingError(f"binding {text!r}: {option} given twice")
        if option == "--localalloc":
            if value:
                raise BindingError(f"binding {text!r}: --localalloc takes no value")
        elif not value:
            raise BindingError(f"binding {text!r}: {option} needs a value ({option}=0)")
        else:
            kind, existing = ("CPU", cpu_ids) if option == "--physcpubind" else ("node", node_ids)
            # an explicit binding naming what this node lacks is refused, not skipped: it is a
            # request for this machine's layout, and skipping it would hide a wrong sweep config
            try:
                ids = parse_id_list(value, name=f"binding {option}", existing=existing, what=kind)
            except IdListError as error:
                raise BindingError(str(error)) from None
            if option == "--preferred" and len(ids) != 1:
                raise BindingError(f"binding {text!r}: --preferred takes one node, not {value}")
        seen[option] = value
    policies = [o for o in seen if o in _MEMORY_OPTIONS]
    if len(policies) > 1:
        raise BindingError(
            f"binding {text!r}: {' and '.join(policies)} are exclusive memory policies: pick one"
        )
    if not words:
        raise BindingError(f"binding {text!r}: empty (use none for no binding)")
    return [f"{o}={v}" if v else o for o, v in seen.items()]


def plan_binding(
    binding: str,
    rank: int | None = None,
    *,
    nodes: Sequence[NumaNode] | None = None,
    hbw: HBWNodes | None = None,
    skip_unavailable: bool = False,
) -> NumactlPlan:
    """The numactl arguments of ``binding`` for local rank ``rank`` on this node.

    ``binding`` is a built-in name (:data:`BINDINGS`) or explicit numactl arguments
    starting with ``--``. ``nodes`` and ``hbw`` default to this machine's topology
    (:func:`hpcmem.node.topology.numa_nodes`, :func:`hpcmem.node.topology.hbw_nodes`).
    ``rank`` defaults to the launcher's (:func:`hpcmem.node.launcher.local_rank`, whose
    :class:`~hpcmem.node.launcher.RankError` refuses a variable that is not a rank).
    Raises :class:`BindingError` naming the value and what is accepted, and its subclass
    :class:`BindingUnavailableError` when a well-formed binding needs what this node lacks;
    with ``skip_unavailable`` such a binding gives a plan without numactl arguments whose
    ``skip_reason`` says why.
    """
    if rank is None:
        rank = local_rank() or 0  # launched alone: rank 0
    if rank < 0:
        raise BindingError(f"local rank {rank} is negative")
    try:
        return _plan(binding, rank, nodes, hbw)
    except BindingUnavailableError as error:
        if not skip_unavailable:
            raise
        name = binding if binding in BINDINGS else "custom"
        return NumactlPlan(name, rank, (), skip_reason=str(error))


def _plan(binding: str, rank: int, nodes: Sequence[NumaNode] | None, hbw: HBWNodes | None
          ) -> NumactlPlan:
    nodes = numa_nodes() if nodes is None else nodes
    if binding in BINDINGS:
        if hbw is None and binding == "hbw":
            try:
                hbw = hbw_nodes()
            except ValueError as error:
                raise BindingError(f"binding 'hbw': cannot find the HBW nodes: {error}") from None
        args = _builtin(binding, rank, nodes, hbw or HBWNodes((), "none", emulated=False))
        return NumactlPlan(binding, rank, tuple(args))
    if binding.lstrip().startswith("--"):
        return NumactlPlan("custom", rank, tuple(_explicit(binding, nodes)))
    raise BindingError(
        f"binding {binding!r} is not one of {', '.join(BINDINGS)} "
        "or explicit numactl arguments (e.g. '--cpunodebind=0 --membind=0')"
    )
