"""The Slurm jobs of a run, as the workflow submitted them: ``RUN/logs/slurm_jobs.jsonl``.

The snakemake process that submits the jobs (:mod:`hpcmem.workflow.slurm`) appends one line
per submission: the Slurm job id and what the job runs, each Snakemake job in it as its rule
and wildcards (a group job: every rule of the group)::

    {"job_id": "4711", "points": ["run_collectives point=allreduce/hbw/ranks=2/binding=cores"]}

Every invocation under the same run id appends to the same file, so it lists the run's
jobs across reruns; ``hpcmem report --slurm-jobs`` draws them. A line is written with one
``write`` to a file opened for appending, so a reader never sees two lines mixed; a last
line still being written (no newline yet) is left for the next read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError

__all__ = ["SubmittedJob", "append_job", "point_label", "read_journal", "submitted_job"]


@dataclass(frozen=True)
class SubmittedJob:
    """One Slurm job of the run: its id and the rule and wildcards of each job it runs."""

    job_id: str
    points: tuple[str, ...]


def point_label(rule: str, wildcards: Mapping[str, Any]) -> str:
    """``rule key=value ...``: a Snakemake job as the job table names it."""
    return " ".join([rule, *(f"{key}={value}" for key, value in wildcards.items())])


def submitted_job(job_id: str, job: Any) -> SubmittedJob:
    """The entry of ``job`` (a Snakemake job, or a group job) submitted as Slurm job
    ``job_id``."""
    members = job.jobs if job.is_group() else [job]
    return SubmittedJob(job_id, tuple(sorted(point_label(member.rule.name,
                                                         member.wildcards_dict)
                                             for member in members)))


def append_job(path: str | os.PathLike[str], job: SubmittedJob) -> None:
    """Add ``job`` to the journal at ``path`` (its folder made if missing); OSError when it
    cannot be written."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"job_id": job.job_id, "points": list(job.points)}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _entry(line: str, where: str) -> SubmittedJob:
    try:
        entry = json.loads(line)
        job_id, points = entry["job_id"], entry["points"]
    except (ValueError, TypeError, KeyError):
        entry = job_id = points = None
    if not (isinstance(job_id, str) and job_id and isinstance(points, list)
            and all(isinstance(point, str) for point in points)):
        raise BadInputError(f"{where}: not a line of a Slurm job journal (accepted: "
                            '{"job_id": "ID", "points": ["RULE WILDCARDS", ...]})')
    return SubmittedJob(job_id, tuple(points))


def read_journal(path: str | os.PathLike[str]) -> list[SubmittedJob]:
    """The jobs in the journal at ``path``, in the order they were submitted ([] when it
    does not exist: the run submitted none); BadInputError naming the line that is not
    one the workflow writes."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise BadInputError(f"{path}: cannot be read: {error.strerror}") from None
    try:
        complete = data[:data.rfind(b"\n") + 1].decode()
    except UnicodeDecodeError as error:
        raise BadInputError(f"{path}: not UTF-8 text (byte {error.start})") from None
    return [_entry(line, f"{path}:{number}")
            for number, line in enumerate(complete.splitlines(), start=1) if line.strip()]
