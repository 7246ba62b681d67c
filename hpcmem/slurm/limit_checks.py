"""Jobs and sweeps against the QOS and association limits that apply to them.

A job goes under its QOS (its own ``qos``, ``slurm-qos``, its association's default, else
``normal``), its partition's QOS, and its association (with the accounts above it). A job
asking for more than a per-job, per-node, per-user or group TRES limit, less than a QOS
minimum, or longer than a MaxWall never starts; a run that keeps more jobs queued at once
than a MaxSubmitJobs limit has submissions refused, and more running than a MaxJobs
limit leaves the rest pending. The Slurm jobs of grouped points (``group-components`` of
them in each) must all fit the queue at once, under those limits and ``jobs:``. Each
finding is a ``(setting, problem)`` pair of text for :mod:`hpcmem.slurm.preflight`'s lines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from hpcmem.slurm.facts import Association, ClusterFacts, PartitionFacts
from hpcmem.slurm.limits import Limits, applying
from hpcmem.slurm.requests import Grouping, JobRequest, RunSettings, SweepRequest

__all__ = ["Finding", "job_findings", "limit_chains", "queued_chains", "sweep_findings"]

#: the setting a line names, and what is wrong with it
Finding = tuple[str, str]
#: TRES limits a job's request is checked against: field -> (per node, a minimum)
_TRES_FIELDS = {"MaxTRESPerJob": (False, False), "MaxTRESPerUser": (False, False),
                "GrpTRES": (False, False), "MaxTRESPerNode": (True, False),
                "MinTRESPerJob": (False, True)}
#: job count limits: field -> what the run's jobs do at once against it
_COUNT_FIELDS = {"MaxSubmitJobsPU": "queued", "MaxSubmitJobs": "queued",
                 "GrpSubmitJobs": "queued", "MaxJobsPU": "running", "MaxJobs": "running",
                 "GrpJobs": "running"}
#: what a TRES counts, in a line: one of it
_NOUNS = {"cpu": "CPU", "node": "node", "gres/gpu": "GPU"}


def _default_qos(association: Association | None) -> str:
    """The QOS Slurm gives a job that names none: its association's default, the one QOS
    the association allows, else ``normal``."""
    if association is None:
        return "normal"
    only = next(iter(association.qos)) if len(association.qos) == 1 else None
    return association.default_qos or only or "normal"


def limit_chains(request: JobRequest, settings: RunSettings, facts: ClusterFacts,
                 account: str | None, partition: PartitionFacts | None
                 ) -> list[tuple[Limits, ...]]:
    """The limits that apply to a job of ``request`` charged to ``account``: its QOS's, its
    partition's QOS's, and its association's with the accounts above it."""
    association = facts.association(account, partition.name if partition else None)
    qos = (request.qos or settings.qos or _default_qos(association)).lower()
    chains = [(facts.qos_limits[name],) for name in (qos, partition and partition.qos)
              if name in facts.qos_limits]
    return [*chains, association.limits] if association else chains


def _ceil_div(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def _asked(request: JobRequest, per_node: bool) -> dict[str, tuple[int, str]]:
    """What a job asks for of each TRES (per node or in all), and the setting saying it."""
    nodes, cpus = request.nodes, request.cpus_per_task
    tasks = _ceil_div(request.tasks, nodes) if per_node else request.tasks
    asked = {"cpu": (tasks * cpus, f"tasks: {tasks} x cpus_per_task: {cpus}" if tasks > 1
                     else f"cpus_per_task: {cpus}"),
             "node": (1 if per_node else nodes, f"nodes: {nodes}")}
    if request.mem_mb is not None:
        asked["mem"] = ((request.mem_mb, f"mem_mb: {request.mem_mb}") if per_node or nodes == 1
                        else (request.mem_mb * nodes, f"mem_mb: {request.mem_mb} x nodes: "
                                                      f"{nodes}"))
    if request.gpus:
        asked["gres/gpu"] = (_ceil_div(request.gpus, nodes) if per_node else request.gpus,
                             f"gpu: {request.gpus}")
    return asked


def _amount(tres: str, amount: int) -> str:
    """``2 CPUs``, ``1 GPU``, ``4000 MB of memory``."""
    if tres == "mem":
        return f"{amount} MB of memory"
    noun = _NOUNS.get(tres, tres)
    return f"{amount} {noun}{'' if amount == 1 else 's'}"


def _shown(name: str, amount: int) -> str:
    return f"{name}={amount}M" if name == "mem" else f"{name}={amount}"


def job_findings(request: JobRequest, chains: Sequence[tuple[Limits, ...]]
                 ) -> Iterator[Finding]:
    """What of ``request`` goes past (or stays below) a limit of ``chains``."""
    for chain in chains:
        for name, (per_node, minimum) in _TRES_FIELDS.items():
            asked = _asked(request, per_node)
            for limits in applying(chain, name):
                for tres, bound in limits.tres[name].items():
                    amount, setting = asked.get(tres, (None, ""))
                    if amount is None or (amount >= bound if minimum else amount <= bound):
                        continue
                    side = "fewer than" if minimum else "more than"
                    verb = "requires" if minimum else "allows"
                    scope = "per node" if per_node else "per job"
                    yield setting, (f"asks for {_amount(tres, amount)} {scope}, "
                                    f"{side} {limits.source} {verb} "
                                    f"({name}={_shown(tres, bound)})")
        for limits in applying(chain, "MaxWall"):
            if request.runtime_min is not None and request.runtime_min > limits.max_wall_min:
                yield (f"runtime: {request.runtime_min}", f"minutes is longer than "
                       f"{limits.source} allows (MaxWall={limits.max_wall_min} minutes)")


def _widest(waves: list[list[int]], jobs: set[int]) -> int:
    """The most of ``jobs`` in one wave: how many of them the run can queue at once."""
    return max((len(jobs.intersection(wave)) for wave in waves), default=0)


class _Crowded(NamedTuple):
    """Jobs of grouped points queued at once with others, more than a bound allows."""

    grouping: Grouping
    #: the jobs queued at once
    queued: int
    #: the fewest points per job that bring them to the bound
    needed: int


def _crowded(sweep: SweepRequest, waves: list[list[int]], jobs: set[int], bound: int
             ) -> _Crowded | None:
    """Whether the most of ``jobs`` queued at once are more than ``bound``, and fewer jobs
    of a group's points would bring them to it."""
    wave = max(waves, key=lambda jobs_of: len(jobs.intersection(jobs_of)), default=[])
    queued = jobs.intersection(wave)
    grouping = max(sweep.groupings, key=lambda g: len(g.jobs & queued), default=None)
    if len(queued) <= bound or grouping is None or not grouping.jobs & queued:
        return None
    needed = grouping.components_for(bound - len(queued - grouping.jobs))
    return _Crowded(grouping, len(queued), needed) if needed else None


def _crowded_finding(sweep: SweepRequest, crowded: _Crowded, limit: str) -> Finding:
    grouping = crowded.grouping
    return (f"group-components: {grouping.name}={grouping.components}",
            f"puts {grouping.points} points in {len(grouping.jobs)} Slurm jobs: "
            f"{crowded.queued} jobs queued at once (the run submits {len(sweep.jobs)}), more "
            f"than {limit}: set group-components: {grouping.name}={crowded.needed} or more")


def queued_chains(facts: ClusterFacts) -> list[list[tuple[Limits, ...]]]:
    """The limits that apply to each of the user's jobs in the queue already."""
    return [limit_chains(JobRequest("queued", qos=job.qos), RunSettings(), facts, job.account,
                         facts.partitions.get(job.partition))
            for job in facts.queued or ()]


def _already(queued: Sequence[Sequence[tuple[Limits, ...]]], source: str, name: str) -> int:
    """How many jobs of ``queued`` (each job's limit chains) count against ``source``'s
    ``name``."""
    return sum(any(limits.source == source for chain in chains
                   for limits in applying(chain, name)) for chains in queued)


def sweep_findings(sweep: SweepRequest, chains: Sequence[Sequence[tuple[Limits, ...]]],
                   queued: Sequence[Sequence[tuple[Limits, ...]]] = ()
                   ) -> Iterator[Finding]:
    """Job count limits the run's jobs together go past; ``chains``: each job's limits,
    ``queued``: those of each of the user's jobs in the queue already, which count against
    its MaxSubmitJobs limits too.

    The jobs of a wave are queued together: past a MaxSubmitJobs limit sbatch refuses the
    rest, or (``jobs:`` at most the limit) they wait their turn, as they do past ``jobs:``.
    Where fewer jobs of grouped points would fit them, one line names ``group-components``
    and the fewest points per job that fit the tightest of those bounds; else a line per
    limit names ``jobs:``."""
    counted: dict[tuple[str, str], tuple[int, set[int]]] = {}
    for index, job_chains in enumerate(chains):
        for chain in job_chains:
            for name in _COUNT_FIELDS:
                for limits in applying(chain, name):
                    counted.setdefault((limits.source, name),
                                       (limits.counts[name], set()))[1].add(index)
    waves, most = sweep.waves(), sweep.most_at_once
    every = set(range(len(sweep.jobs)))
    widest = _widest(waves, every)
    setting = "jobs: not set" if most is None else f"jobs: {most}"
    crowding: list[tuple[_Crowded, str]] = []
    for (source, name), (bound, jobs) in counted.items():
        doing = _COUNT_FIELDS[name]
        already = _already(queued, source, name) if doing == "queued" else 0
        room = bound - already
        limit = f"{source} allows ({name}={bound})" + (
            f" beside the {already} of your jobs queued already (squeue --me)" if already
            else "")
        if doing == "queued" and room > 0 and (crowded := _crowded(sweep, waves, jobs, room)):
            crowding.append((crowded, limit))
            continue
        at_once = _widest(waves, jobs) if most is None else min(most, _widest(waves, jobs))
        if at_once <= room:
            continue
        then = ("sbatch refuses the jobs past it" if doing == "queued"
                else "the jobs past it pend")
        fix = (f"; set jobs: {room} or fewer" if room > 0 else
               "; wait for your queued jobs to end" if already else "")
        yield setting, (f"lets {at_once} Slurm jobs be {doing} at once (the run submits "
                        f"{len(sweep.jobs)}, at most {widest} at a time), more than {limit}: "
                        f"{then}{fix}")
    if most is not None and (crowded := _crowded(sweep, waves, every, most)):
        crowding.append((crowded, f"jobs: {most} lets Snakemake queue"))
    if crowding:  # the tightest, a site's limit before jobs: when they tie
        yield _crowded_finding(sweep, *max(crowding, key=lambda item: item[0].needed))
