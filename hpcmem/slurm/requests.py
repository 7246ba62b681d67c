"""What a run asks Slurm for: each rule's jobs, each group, and the whole sweep.

A :class:`JobRequest` is what sbatch would be asked for on behalf of a rule's jobs, a
:class:`GroupRequest` the jobs of one Snakemake group (one Slurm job), a
:class:`SweepRequest` every Slurm job the run submits and which ones each waits for, so
that the preflight can count how many are queued at once (:meth:`SweepRequest.waves`),
and a :class:`Grouping` the Slurm jobs ``group-components`` makes of one group's points.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GroupRequest", "Grouping", "JobRequest", "RunSettings", "SweepRequest"]


@dataclass(frozen=True)
class JobRequest:
    """What the jobs of one rule ask Slurm for (None: not set, Slurm's default applies)."""

    rule: str
    partition: str | None = None
    account: str | None = None
    #: the job's own ``qos`` resource
    qos: str | None = None
    cpus_per_task: int = 1
    tasks: int = 1
    nodes: int = 1
    #: memory per node (sbatch --mem)
    mem_mb: int | None = None
    #: GPUs of the whole job (sbatch --gpus)
    gpus: int = 0
    runtime_min: int | None = None
    constraint: str | None = None

    @property
    def cpus(self) -> int:
        """CPUs of the whole job."""
        return self.tasks * self.cpus_per_task


@dataclass(frozen=True)
class GroupRequest:
    """The jobs of one Snakemake group, submitted as one Slurm job."""

    name: str
    rules: tuple[str, ...]
    #: each text setting any of its rules sets (partition, account, ...): rule -> value
    #: (None: that rule leaves it unset); the group can only be submitted with one value
    text_settings: dict[str, dict[str, str | None]]
    #: the group job's request, its rules' resources combined as Snakemake combines them
    #: (runtime summed over consecutive steps); None when it has disagreements
    combined: JobRequest | None

    @property
    def label(self) -> str:
        return f"group {self.name}: {' + '.join(self.rules)}"

    @property
    def disagreements(self) -> dict[str, dict[str, str | None]]:
        """The text settings its rules ask different values of."""
        return {setting: values for setting, values in self.text_settings.items()
                if len(set(values.values())) > 1}


@dataclass(frozen=True)
class RunSettings:
    """Executor settings that apply to every job of the run."""

    #: ``slurm-qos``: the QOS of every job
    qos: str | None = None
    #: ``slurm-no-account``: jobs are submitted without ``-A``
    no_account: bool = False


@dataclass(frozen=True)
class Grouping:
    """The points of one Snakemake group in a run (its connected components: jobs that do
    not wait for each other), ``components`` of them in each Slurm job."""

    #: the group, as ``group-components`` names it
    name: str
    #: ``group-components`` of the group: the most points in one Slurm job
    components: int
    #: the group's points in the run
    points: int
    #: the indexes (in :attr:`SweepRequest.jobs`) of its Slurm jobs
    jobs: frozenset[int]

    def components_for(self, slots: int) -> int | None:
        """The fewest points per Slurm job that put the group's points in at most ``slots``
        jobs; None for none (``slots`` below 1)."""
        return -(-self.points // slots) if slots > 0 else None


@dataclass(frozen=True)
class SweepRequest:
    """Every Slurm job a run submits (a group is one), and the profile's ``jobs:``."""

    #: one request per Slurm job (a group's: that of one of its rules, for its partition,
    #: account and QOS)
    jobs: tuple[JobRequest, ...]
    #: for each job, the indexes of the jobs it waits for
    needs: tuple[frozenset[int], ...]
    #: ``jobs:``, the most jobs Snakemake keeps queued or running at once (None: no limit)
    most_at_once: int | None = None
    #: the groups holding more than one point, whose Slurm jobs ``group-components`` makes
    groupings: tuple[Grouping, ...] = ()

    def waves(self) -> list[list[int]]:
        """The jobs by how many jobs before them they wait for, at most (the DAG's levels):
        the jobs of one wave can be queued at once, those of different ones, here, not."""
        depth = [0] * len(self.jobs)
        waiting = [len(needs) for needs in self.needs]
        waited_by: list[list[int]] = [[] for _ in self.jobs]
        for index, needs in enumerate(self.needs):
            for needed in needs:
                waited_by[needed].append(index)
        ready = [index for index, count in enumerate(waiting) if count == 0]
        while ready:  # (jobs of a cycle, which Snakemake refuses, are left out)
            index = ready.pop()
            for later in waited_by[index]:
                depth[later] = max(depth[later], depth[index] + 1)
                waiting[later] -= 1
                if waiting[later] == 0:
                    ready.append(later)
        waves: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
        for index, level in enumerate(depth):
            waves[level].append(index)
        return waves
