"""``hpcmem preflight``: the workflow's own preflight, with nothing submitted.

Runs snakemake with the caller's profile and configuration over every job of the sweep
(``--forceall``, without locking the working directory) up to the moment it would
submit the first job. There the workflow (:mod:`hpcmem.workflow.slurm`) checks each job
against the cluster, writes what it found to a file named by ``HPCMEM_PREFLIGHT_REPORT``
and stops. So the preflight sees exactly the jobs, resources, partitions, accounts and
QOS of the run it precedes.

Before that, ``hpcmem preflight`` reads the files Snakemake reads first with
:func:`hpcmem.workflow.config.check_profile`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpcmem.errors import HpcmemError
from hpcmem.workflow.refusal import REFUSED
from hpcmem.workflow.slurm import PREFLIGHT_REPORT

__all__ = ["PreflightResult", "WorkflowStoppedError", "run_preflight"]

#: where snakemake's account of an error starts: ``WorkflowError in file ...``,
#: ``Error: ...``, ``snakemake: error: ...`` (argparse, after its usage text)
_ERROR_LINE = re.compile(r"^(?:\w*Error\b|[\w.-]+: error:)")
#: the header of a WorkflowError raised in a Snakefile: where, not why
_WHERE_LINE = re.compile(r"^\w*Error in file .*, line \d+:$")
#: a traceback frame: the end of the account
_FRAME_LINE = re.compile(r"^\s*(?:File \"|Traceback \()")


class WorkflowStoppedError(HpcmemError):
    """Snakemake stopped before the preflight (bad profile, config or workflow)."""


@dataclass(frozen=True)
class PreflightResult:
    """One line per problem; when there is none, what was checked."""

    problems: list[str]
    summary: str | None


def _snakemake() -> str:
    """The snakemake next to this Python (the same environment), else the one on PATH."""
    beside = Path(sys.executable).with_name("snakemake")
    if beside.exists():
        return str(beside)
    found = shutil.which("snakemake")
    if found is None:
        raise WorkflowStoppedError("snakemake not found: install hpcmem[workflow] (make setup)")
    return found


def _why_stopped(output: str) -> str:
    """What snakemake said about why it stopped, as one ``|``-separated line: its account
    of the error from its first error line on (without traceback frames or a Snakefile's
    ``... in file X, line N:``), the first and last paragraphs when there are more (what
    failed, and where: jsonschema puts the schema's own text between); else its last lines.
    A refusal of the workflow itself (:mod:`hpcmem.workflow.refusal`) is its one line.
    """
    lines = output.splitlines()
    refusal = [line for line in lines if line.startswith(REFUSED)]
    if refusal:  # the workflow's own one line
        return refusal[-1].removeprefix(REFUSED)
    start = next((i for i, line in enumerate(lines) if _ERROR_LINE.match(line)), None)
    if start is None:
        return " | ".join([line.strip() for line in lines if line.strip()][-6:])
    account = []
    for line in lines[start:]:
        if _FRAME_LINE.match(line):
            break
        if not _WHERE_LINE.match(line):
            account.append(line.strip())
    paragraphs = [part for part in "\n".join(account).split("\n\n") if part.strip()]
    kept = paragraphs if len(paragraphs) <= 2 else [paragraphs[0], paragraphs[-1]]
    return " | ".join(line for part in kept for line in part.splitlines() if line) \
        or lines[start].strip()


def run_preflight(snakemake_args: list[str]) -> PreflightResult:
    """Run the preflight of ``snakemake SNAKEMAKE_ARGS``; raises WorkflowStoppedError with what
    snakemake said when it stopped before the preflight."""
    with tempfile.TemporaryDirectory(prefix="hpcmem-preflight-") as folder:
        report = Path(folder, "preflight.json")
        command = [_snakemake(), *snakemake_args, "--forceall", "--nolock"]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, **{PREFLIGHT_REPORT: str(report)}))
        if not report.exists():
            raise WorkflowStoppedError(f"snakemake stopped before the preflight (exit "
                                  f"{done.returncode}): {_why_stopped(done.stdout)}")
        found = json.loads(report.read_text())
    return PreflightResult(problems=found["problems"], summary=found.get("summary"))
