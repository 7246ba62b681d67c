"""Each Slurm job the workflow submits, noted in the run's journal of jobs as it is submitted.

:func:`note_submissions` (called by :func:`hpcmem.workflow.slurm.on_start`) hooks the slurm
executor's report of each submission, where the Snakemake job (or group job) and its Slurm
job id meet, and appends both to the journal (:mod:`hpcmem.slurm.journal`), which the
report's job table reads. A journal that cannot be written (a full disk) never stops the
run: one warning says which jobs the table will miss.
"""

from __future__ import annotations

import os
from typing import Any

from hpcmem.slurm.journal import append_job, submitted_job

__all__ = ["note_submissions"]


def note_submissions(executor: Any, journal: str | os.PathLike[str], logger: Any) -> None:
    """From now on, note every job ``executor`` (the slurm executor's instance) reports
    submitted in ``journal``. The executor has no hook for this: its
    ``report_job_submission`` is wrapped, on this instance only."""
    report = executor.report_job_submission
    warned = False

    def reported(job_info: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal warned
        report(job_info, *args, **kwargs)
        if not job_info.external_jobid:
            return
        try:
            append_job(journal, submitted_job(str(job_info.external_jobid), job_info.job))
        except OSError as error:
            if not warned:
                warned = True
                logger.warning(f"hpcmem: cannot note Slurm job {job_info.external_jobid} in "
                               f"{journal} ({error.strerror}): the report's job table will "
                               "miss it and the jobs after it that cannot be noted either")

    executor.report_job_submission = reported
