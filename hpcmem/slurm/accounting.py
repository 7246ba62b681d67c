"""What Slurm's accounting says about a run's jobs: ``sacct``, one line per job.

:func:`job_accounts` asks ``sacct -X`` (the job allocations, not their steps) for the
partition, account, QOS, state, elapsed time, exit code and comment of given job ids. A
cluster without accounting (no slurmdbd: ``Slurm accounting storage is disabled``), a
``sacct`` that is missing, fails or prints what is not read here, is a
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

__all__ = ["FIELDS", "JobAccount", "job_accounts", "parse_accounting", "parse_queue",
           "sacct_elapsed"]

#: what is asked of sacct, in its order (Comment last: it may hold ``|``)
FIELDS = ("JobID", "Partition", "Account", "QOS", "State", "Elapsed", "ExitCode", "Comment")


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


def job_accounts(job_ids: Sequence[str]) -> dict[str, JobAccount]:
    """What sacct says about each of ``job_ids`` (a job it does not know is left out), with
    slurmctld's view of those it has as PENDING or not at all (module docstring)."""
    if not job_ids:
        return {}
    shown = f"`sacct -X -j ID,... --format={','.join(FIELDS)}`"
    accounts = parse_accounting(slurm_command(
        "sacct", "-X", "--parsable2", "--noheader", "-j", ",".join(job_ids),
        f"--format={','.join(FIELDS)}", shown=shown), shown)
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
                                           comment=before.comment if before else "")
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


def sacct_elapsed(text: str) -> str:
    """squeue's ``[days-][hours:]minutes:seconds`` as sacct's ``[days-]HH:MM:SS``."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")] if clock.replace(":", "").isdigit() else []
    if not 2 <= len(parts) <= 3:
        return text
    hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{seconds:02d}"
