"""Jobs of a run that will never start: pending for a reason that does not clear by itself.

The slurm executor plugin waits for such jobs for ever: a job pending with
``Reason=PartitionConfig`` or ``InvalidQOS`` stays pending. :class:`Watchdog` looks at the
run's jobs (all named alike by the executor) with ``squeue`` and calls back with the jobs it
found, so the run can end naming them. (A job cancelled underneath the run fails through the
plugin: :func:`hpcmem.workflow.slurm_jobs.cancelled_jobs_fail`.)
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
    """A job of the run that will never start."""

    job_id: str
    state: str
    reason: str
    #: the executor's ``--comment``: rule and wildcards
    comment: str

    def describe(self) -> str:
        """One line: the job, what it runs, and why it will not start."""
        what = f" ({self.comment})" if self.comment else ""
        return (f"Slurm job {self.job_id}{what} is {self.state} with Reason={self.reason}, "
                "which does not clear by itself")


def stuck_jobs(job_name: str) -> list[StuckJob]:
    """Jobs named ``job_name`` pending for a reason that does not clear by itself
    (``squeue``)."""
    queued = slurm_command("squeue", "-h", "-t", "PENDING", "--name", job_name,
                           "-o", "%i|%T|%r|%k")
    stuck = []
    for line in queued.splitlines():
        if line.count("|") < 3:
            continue
        job_id, state, reason, comment = line.split("|", 3)
        if hopeless(reason):
            stuck.append(StuckJob(job_id, state, reason, comment if comment != "(null)" else ""))
    return stuck


class Watchdog(threading.Thread):
    """Looks at the jobs named ``job_name`` every ``interval`` seconds (a daemon thread:
    it ends with the process) and calls ``on_stuck`` once, with the stuck jobs."""

    def __init__(self, job_name: str, on_stuck: Callable[[list[StuckJob]], None],
                 interval: float) -> None:
        super().__init__(name="hpcmem-slurm-watchdog", daemon=True)
        self.job_name = job_name
        self.on_stuck = on_stuck
        self.interval = interval

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                stuck = stuck_jobs(self.job_name)
            except SlurmCommandError:
                continue  # a busy controller: look again next time
            if stuck:
                self.on_stuck(stuck)
                return
