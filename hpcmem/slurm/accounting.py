"""What Slurm's accounting says about a run's jobs: ``sacct``, one line per job.

:func:`job_accounts` asks ``sacct -X`` (the job allocations, not their steps) for the
partition, account, QOS, state, elapsed time, exit code and comment of given job ids. A
cluster without accounting (no slurmdbd: ``Slurm accounting storage is disabled``), a
``sacct`` that is missing, fails or prints what is not read here, is a
:class:`~hpcmem.slurm.facts.SlurmCommandError` saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcmem.slurm.facts import SlurmCommandError, slurm_command

__all__ = ["FIELDS", "JobAccount", "job_accounts", "parse_accounting"]

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
    """What sacct says about each of ``job_ids`` (a job it does not know is left out)."""
    if not job_ids:
        return {}
    shown = f"`sacct -X -j ID,... --format={','.join(FIELDS)}`"
    return parse_accounting(slurm_command("sacct", "-X", "--parsable2", "--noheader", "-j",
                                          ",".join(job_ids), f"--format={','.join(FIELDS)}",
                                          shown=shown), shown)
