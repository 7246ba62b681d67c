"""What Slurm's accounting says about a run's jobs: ``sacct``, one line per job.

:func:`job_accounts` asks ``sacct -X`` (the job allocations, not their steps) for the
partition, account, QOS, state, elapsed time, exit code and comment of given job ids, and
``sacct`` of the jobs with their steps for what they used, as ``seff`` reads it
(:class:`JobUsage`): the job's line sums its steps' CPU time (``TotalCPU``; the ``-X`` line
leaves it zero) beside the CPU time allocated (``CPUTimeRAW``), and each step has its
largest resident set (``MaxRSS``, sampled every ``JobAcctGatherFrequency``: a step shorter
than that has none). A cluster without accounting (no slurmdbd: ``Slurm accounting storage
is disabled``), a ``sacct`` that is missing, fails or prints what is not read here, is a
:class:`~hpcmem.slurm.facts.SlurmCommandError` saying so.

slurmdbd learns of a job's start from slurmctld a moment after it: a job already running
(the one drawing a report, say) can still be PENDING in sacct, with no partition. For a job
sacct lists as PENDING, or not at all, ``squeue`` (slurmctld's own view) gives the
partition, account, QOS, state and elapsed time where it still holds the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpcmem.slurm.facts import SlurmCommandError, slurm_command
from hpcmem.units import UnitError, parse_size

__all__ = ["FIELDS", "USAGE_FIELDS", "JobAccount", "JobUsage", "job_accounts",
           "parse_accounting", "parse_queue", "parse_usage", "sacct_elapsed", "sacct_seconds"]

#: what is asked of sacct, in its order (Comment last: it may hold ``|``)
FIELDS = ("JobID", "Partition", "Account", "QOS", "State", "Elapsed", "ExitCode", "Comment")
#: what is asked of sacct for each job and step's use
USAGE_FIELDS = ("JobID", "MaxRSS", "TotalCPU", "CPUTimeRAW")


@dataclass(frozen=True)
class JobUsage:
    """What a job used, as sacct has it (None: not known)."""

    #: the largest resident set of any of its steps, bytes
    max_rss: int | None = None
    #: CPU seconds its steps used
    cpu_seconds: float | None = None
    #: CPU seconds allocated to it: elapsed time times CPUs
    allocated_seconds: float | None = None

    @property
    def cpu_efficiency(self) -> float | None:
        """CPU time used over CPU time allocated (None: unknown, or none allocated yet)."""
        if self.cpu_seconds is None or not self.allocated_seconds:
            return None
        return self.cpu_seconds / self.allocated_seconds


@dataclass(frozen=True)
class JobAccount:
    """One job as sacct lists it."""

    job_id: str
    partition: str
    account: str
    qos: str
    state: str
    elapsed: str
    exit_code: str
    #: the executor's ``--comment`` (rule and wildcards), where the site stores job comments
    comment: str
    usage: JobUsage = JobUsage()


def parse_accounting(text: str, command: str = "sacct") -> dict[str, JobAccount]:
    """Each job of ``sacct --parsable2 --noheader --format=FIELDS`` output, by job id;
    SlurmCommandError naming ``command`` for a line of fewer fields."""
    jobs = {}
    for line in filter(None, text.splitlines()):
        values = line.split("|", len(FIELDS) - 1)
        if len(values) != len(FIELDS):
            raise SlurmCommandError(f"{command}: {line!r} is not {len(FIELDS)} fields "
                                    f"separated by '|' (accepted: {'|'.join(FIELDS)})")
        jobs[values[0]] = JobAccount(*values)
    return jobs


def job_accounts(job_ids: Sequence[str], usage: bool = True) -> dict[str, JobAccount]:
    """What sacct says about each of ``job_ids`` (a job it does not know is left out), with
    slurmctld's view of those it has as PENDING or not at all (module docstring); without
    ``usage``, their memory and CPU use are not asked for (one sacct call less)."""
    if not job_ids:
        return {}
    shown = f"`sacct -X -j ID,... --format={','.join(FIELDS)}`"
    accounts = parse_accounting(slurm_command(
        "sacct", "-X", "--parsable2", "--noheader", "-j", ",".join(job_ids),
        f"--format={','.join(FIELDS)}", shown=shown), shown)
    if usage:
        used = parse_usage(slurm_command(
            "sacct", "--parsable2", "--noheader", "-j", ",".join(job_ids),
            f"--format={','.join(USAGE_FIELDS)}",
            shown=f"`sacct -j ID,... --format={','.join(USAGE_FIELDS)}`"))
        accounts = {job_id: replace(account, usage=used.get(job_id, JobUsage()))
                    for job_id, account in accounts.items()}
    behind = [j for j in job_ids if j not in accounts or accounts[j].state == "PENDING"]
    if behind:
        try:
            queued = slurm_command("squeue", "-h", "-t", "all", "-j", ",".join(behind), "-o",
                                   "%i|%P|%a|%q|%T|%M")
        except SlurmCommandError:  # gone from slurmctld too: sacct's word stands
            queued = ""
        for job_id, held in parse_queue(queued).items():
            if job_id in behind:
                before = accounts.get(job_id)
                accounts[job_id] = replace(held, exit_code=before.exit_code if before else "",
                                           comment=before.comment if before else "",
                                           usage=before.usage if before else JobUsage())
    return accounts


def parse_queue(text: str) -> dict[str, JobAccount]:
    """Each job of ``squeue -h -o '%i|%P|%a|%q|%T|%M'`` output, by job id, its elapsed time
    written as sacct writes it; lines of other shapes are left out."""
    jobs = {}
    for line in filter(None, text.splitlines()):
        values = line.split("|")
        if len(values) == 6:
            job_id, partition, account, qos, state, elapsed = values
            jobs[job_id] = JobAccount(job_id, partition, account, qos, state,
                                      sacct_elapsed(elapsed), "", "")
    return jobs


def parse_usage(text: str) -> dict[str, JobUsage]:
    """Each job's use in ``sacct --format=JobID,MaxRSS,TotalCPU,CPUTimeRAW`` output (without
    ``-X``): CPU time from the job's own line (``123``), the largest ``MaxRSS`` of its steps
    (``123.batch``, ``123.0``); lines of other shapes are left out."""
    usage: dict[str, JobUsage] = {}
    for line in filter(None, text.splitlines()):
        fields = line.split("|")
        if len(fields) != len(USAGE_FIELDS):
            continue
        step, rss, cpu, allocated = fields
        job_id, _, step_name = step.partition(".")
        found = usage.get(job_id, JobUsage())
        if not step_name:
            found = replace(found, cpu_seconds=sacct_seconds(cpu),
                            allocated_seconds=float(allocated) if allocated.isdigit() else None)
        elif (nbytes := _bytes(rss)) is not None:
            found = replace(found, max_rss=max(found.max_rss or 0, nbytes))
        usage[job_id] = found
    return usage


def _bytes(size: str) -> int | None:
    """sacct's ``2048K``, ``1.5M`` (a plain number: KiB) in bytes; None for what is not one."""
    try:
        return parse_size(size + "K" if size[-1:].isdigit() else size)
    except UnitError:
        return None


def sacct_seconds(text: str) -> float | None:
    """sacct's ``[DD-][HH:]MM:SS[.mmm]`` (or plain seconds) in seconds; None for what is
    not one."""
    days, _, clock = text.rpartition("-")
    try:
        values = [float(part) for part in clock.split(":")]
        whole_days = int(days) if days else 0
    except ValueError:
        return None
    if len(values) > 3:
        return None
    seconds = 0.0
    for value in values:
        seconds = seconds * 60 + value
    return whole_days * 86400 + seconds


def sacct_elapsed(text: str) -> str:
    """squeue's ``[days-][hours:]minutes:seconds`` as sacct's ``[days-]HH:MM:SS``."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")] if clock.replace(":", "").isdigit() else []
    if not 2 <= len(parts) <= 3:
        return text
    hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{seconds:02d}"
