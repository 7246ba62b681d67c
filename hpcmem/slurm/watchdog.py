"""Jobs of a run that will never finish: cancelled underneath it, or pending for a reason
that does not clear by itself.

The slurm executor plugin waits for such jobs for ever: it does not recognise sacct's
``CANCELLED by <uid>``, and a job pending with ``Reason=PartitionConfig`` or
``InvalidQOS`` stays pending. :class:`Watchdog` looks at the run's jobs (all named
alike by the executor) with ``squeue`` and ``sacct`` and calls back with the jobs it
found, so the run can end naming them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpcmem.slurm.facts import SlurmCommandError, slurm_command

__all__ = ["StuckJob", "Watchdog", "hopeless", "stuck_jobs"]

#: pending reasons (squeue %r) that only a change of the job or the cluster clears
HOPELESS_REASONS = frozenset({
    "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
    "InvalidAccount", "InvalidQOS", "QOSNotAllowed", "AccountNotAllowed",
    "DependencyNeverSatisfied",
})
#: per-job limits of an association or QOS (AssocMaxCpuPerJobLimit, QOSMaxGRESPerJob...)
#: and QOS minimums (QOSMinCpuNotSatisfied): the job asks for what it may never get
_PER_JOB_LIMIT = re.compile(r"^(?:(?:Assoc|QOS)Max\w*PerJob\w*|QOSMin\w+)$")


def hopeless(reason: str) -> bool:
    """Whether a job pending for ``reason`` will never start by itself."""
    return reason in HOPELESS_REASONS or bool(_PER_JOB_LIMIT.match(reason))


@dataclass(frozen=True)
class StuckJob:
    """A job of the run that will never complete."""

    job_id: str
    state: str
    reason: str
    #: the executor's ``--comment``: rule and wildcards
    comment: str

    def describe(self) -> str:
        """One line: the job, what it runs, and why it will not finish."""
        what = f" ({self.comment})" if self.comment else ""
        if self.state.startswith("CANCELLED"):
            return f"Slurm job {self.job_id}{what} was {self.state}"
        return (f"Slurm job {self.job_id}{what} is {self.state} with Reason={self.reason}, "
                "which does not clear by itself")


def stuck_jobs(job_name: str, since: str, comments: dict[str, str]) -> list[StuckJob]:
    """Jobs named ``job_name`` (submitted after ``since``) that will never complete.

    ``squeue`` shows pending reasons and the jobs slurmctld still holds, ``sacct`` the
    ones it has let go (when there is accounting: without, squeue alone answers).
    ``comments`` maps job ids to their ``--comment``, filled while jobs are queued,
    since ``sacct`` only has it where the site stores job comments.
    """
    stuck: dict[str, StuckJob] = {}
    queued = slurm_command("squeue", "-h", "-t", "all", "--name", job_name,
                           "-o", "%i|%T|%r|%k")
    for line in queued.splitlines():
        if line.count("|") < 3:
            continue
        job_id, state, reason, comment = line.split("|", 3)
        comments[job_id] = comment if comment != "(null)" else ""
        if (state == "PENDING" and hopeless(reason)) or state.startswith("CANCELLED"):
            stuck[job_id] = StuckJob(job_id, state, reason, comments[job_id])
    try:
        ended = slurm_command("sacct", "-X", "-n", "-P", "--name", job_name, "-S", since,
                              "-o", "JobIDRaw,State")
    except SlurmCommandError:
        ended = ""
    for line in ended.splitlines():
        job_id, _, state = line.partition("|")
        if state.startswith("CANCELLED"):
            comment = comments.get(job_id) or _comment_of_ended(job_id)
            stuck[job_id] = StuckJob(job_id, state, "", comment)
    return list(stuck.values())


def _comment_of_ended(job_id: str) -> str:
    """The comment of a job that ended before squeue showed it (slurmctld keeps ended jobs
    for MinJobAge seconds); empty when it is gone."""
    try:
        shown = slurm_command("scontrol", "show", "job", "-o", job_id)
    except SlurmCommandError:
        return ""
    found = re.search(r"(?:^|\s)Comment=(\S+)", shown)
    return found[1] if found and found[1] != "(null)" else ""


class Watchdog(threading.Thread):
    """Looks at the jobs named ``job_name`` every ``interval`` seconds (a daemon thread:
    it ends with the process) and calls ``on_stuck`` once, with the stuck jobs."""

    def __init__(self, job_name: str, on_stuck: Callable[[list[StuckJob]], None],
                 interval: float) -> None:
        super().__init__(name="hpcmem-slurm-watchdog", daemon=True)
        self.job_name = job_name
        self.on_stuck = on_stuck
        self.interval = interval
        self.since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))

    def run(self) -> None:
        comments: dict[str, str] = {}
        while True:
            time.sleep(self.interval)
            try:
                stuck = stuck_jobs(self.job_name, self.since, comments)
            except SlurmCommandError:
                continue  # a busy controller: look again next time
            if stuck:
                self.on_stuck(stuck)
                return
