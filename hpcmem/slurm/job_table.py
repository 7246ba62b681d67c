"""The report's table of a run's Slurm jobs: what each ran and what sacct says of it.

One row per job, sorted by job id: the jobs the workflow submitted for the run
(:mod:`hpcmem.slurm.journal`, every rerun included) and any other job its records name,
each with its points (the rule and wildcards of each Snakemake job in it; for a job only
the records name, the executor's ``--comment`` where sacct keeps it) and sacct's
partition, account, QOS, state, elapsed time, exit code, largest resident set of a step
(MaxRSS) and CPU efficiency (CPU time used over CPU time allocated, as ``seff`` gives it),
as sacct gives them when the report is drawn. A job cancelled after its points wrote their
records (the run's own cancel arriving as they finished) says so beside its state. Without
accounting, or when sacct fails, the table says why and shows the points alone.
"""

from __future__ import annotations

import html
import os
from collections.abc import Collection, Sequence

from hpcmem.draw.html import table
from hpcmem.record.provenance import slurm_job_order, utc_now
from hpcmem.slurm.accounting import JobAccount, job_accounts
from hpcmem.slurm.facts import SlurmCommandError
from hpcmem.slurm.journal import SubmittedJob

__all__ = ["HEADERS", "job_rows", "jobs_html", "run_job_ids"]

#: the table's columns
HEADERS = ("Slurm job", "points", "partition", "account", "QOS", "state", "elapsed",
           "exit code", "MaxRSS", "CPU efficiency")
_KINDS = ("text", "key", "text", "text", "text", "text", "num", "text", "num", "num")


def run_job_ids(submitted: Sequence[SubmittedJob], record_ids: Sequence[str]) -> list[str]:
    """Every job the workflow submitted or a record names, sorted by job id."""
    return sorted({*(job.job_id for job in submitted), *record_ids}, key=slurm_job_order)


def job_rows(job_ids: Sequence[str], submitted: Sequence[SubmittedJob],
             accounts: dict[str, JobAccount], recorded: Collection[str] = ()
             ) -> list[list[str]]:
    """One row per job of ``job_ids``: its points from ``submitted`` (else its comment),
    sacct's columns from ``accounts`` ('-' for a job it does not list); a job cancelled
    after writing records (``recorded``: the job ids the run's records name) says so, its
    finished points kept and not redone."""
    points = {job.job_id: job.points for job in submitted}
    rows = []
    for job_id in job_ids:
        account = accounts.get(job_id)
        named = points.get(job_id) or ([account.comment] if account and account.comment
                                       else ["-"])
        state = account.state if account else ""
        if state.startswith("CANCELLED") and job_id in recorded:
            state += " (its records kept)"
        shown = ([account.partition, account.account, account.qos, state,
                  account.elapsed, account.exit_code, _size(account.usage.max_rss),
                  _percent(account.usage.cpu_efficiency)] if account else ["-"] * 8)
        rows.append([job_id, "; ".join(named), *(value or "-" for value in shown)])
    return rows


def _size(nbytes: int | None) -> str:
    """Bytes in binary units, to three figures ('' unknown)."""
    if nbytes is None:
        return ""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while power < len(units) - 1 and nbytes >= 1024 ** (power + 1):
        power += 1
    return f"{nbytes / 1024 ** power:.3g} {units[power]}"


def _percent(share: float | None) -> str:
    """A share as a whole percentage ('' unknown)."""
    return "" if share is None else f"{share * 100:.0f}%"


def jobs_html(submitted: Sequence[SubmittedJob], record_ids: Sequence[str]) -> str:
    """The run's Slurm jobs as the report's run section shows them (sacct asked now)."""
    job_ids = run_job_ids(submitted, record_ids)
    if not job_ids:
        return '<p class="note">Slurm jobs: none (this run submitted no Slurm job).</p>'
    try:
        accounts = job_accounts(job_ids)
        drawing = os.environ.get("SLURM_JOB_ID")
        note = f"As sacct gave them at {utc_now()}, when the report was drawn" + (
            f" (by job {drawing}, still RUNNING then)." if drawing in job_ids else ".")
    except SlurmCommandError as error:
        accounts = {}
        note = ("Partition, account, QOS, state, elapsed time, exit code, MaxRSS and CPU "
                "efficiency unknown: "
                f"sacct could not say ({error}).")
    return (f"<h3>Slurm jobs ({len(job_ids)})</h3>\n"
            f'<p class="note">{html.escape(note)}</p>\n'
            + table(HEADERS, job_rows(job_ids, submitted, accounts, set(record_ids)), _KINDS))
