"""What a run that failed or was ended left undone: every point whose records are not
there, and why, in ``RUN/logs/unfinished.txt`` and the run's last lines (``onerror``).

A point is a job of a benchmark rule (:data:`POINT_RULES`). Why it is unfinished: it
failed (the Slurm job that ran it last, from the run's journal, and what sacct says of
it: ``FAILED``, ``CANCELLED``, ``NODE_FAIL``, ``TIMEOUT``...), or it never ran (the run
ended first, or it waits for a job that failed). The file is replaced whole, one point a
line, tab-separated: the point as the job table names it, then why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from hpcmem.record.jsonl import atomic_open
from hpcmem.slurm.accounting import job_accounts
from hpcmem.slurm.facts import SlurmCommandError
from hpcmem.slurm.journal import point_label, read_journal

__all__ = ["POINT_RULES", "report_unfinished", "unfinished_points"]

#: the rules whose jobs are points
POINT_RULES = frozenset({"run_collectives", "run_collectives_native", "run_train",
                         "run_train_ranks"})
#: points the log lists before it points to the file
SHOWN = 10


def _members(jobs: Iterable[Any]) -> set[Any]:
    """Snakemake jobs, a group job's members in its place."""
    return {member for job in jobs for member in (job.jobs if job.is_group() else [job])}


def unfinished_points(jobs: Iterable[Any], failed: Iterable[Any],
                      last_slurm_job: dict[str, str], states: dict[str, str]
                      ) -> list[tuple[str, str]]:
    """``(point, why)`` of each point job of ``jobs`` (those the run had to do and did not
    finish) whose outputs are not all there;
    ``failed``: the jobs that failed, ``last_slurm_job``: the Slurm job that ran each point
    last, ``states``: sacct's state of each Slurm job."""
    failed = _members(failed)
    found = []
    for job in jobs:
        if job.rule.name not in POINT_RULES or all(os.path.exists(f) for f in job.output):
            continue
        point = point_label(job.rule.name, job.wildcards_dict)
        slurm = last_slurm_job.get(point)
        ran = f" (Slurm job {slurm}: {states.get(slurm) or 'state unknown'})" if slurm else ""
        why = f"failed{ran}" if job in failed else (
            f"ended unfinished{ran}" if slurm else "not run: the run ended first")
        found.append((point, why))
    return sorted(found)


def report_unfinished(workflow: Any, logger: Any, journal: str, path: str) -> None:
    """``onerror``: write the run's unfinished points to ``path`` and name the first ones
    in the log (nothing when every point is finished)."""
    last = {point: job.job_id for job in read_journal(journal) for point in job.points}
    try:
        states = {job_id: account.state for job_id, account in
                  job_accounts(sorted(set(last.values())), usage=False).items()}
    except SlurmCommandError:  # no Slurm, or no accounting: the job ids say enough
        states = {}
    points = unfinished_points(workflow.dag.needrun_jobs(), workflow.scheduler.failed, last,
                               states)
    if not points:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_open(path) as out:
        out.writelines(f"{point}\t{why}\n" for point, why in points)
    total = sum(job.rule.name in POINT_RULES for job in workflow.dag.jobs)
    more = f"; {len(points) - SHOWN} more" if len(points) > SHOWN else ""
    logger.error(f"hpcmem: {len(points)} of {total} points unfinished (all in {path}"
                 f"{more}):\n" + "\n".join(f"  {point}: {why}"
                                           for point, why in points[:SHOWN]))
