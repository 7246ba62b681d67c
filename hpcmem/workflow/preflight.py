"""``hpcmem preflight``: the workflow's own preflight, with nothing submitted.

Runs snakemake with the caller's profile and configuration over every job of the sweep
(``--forceall``, without locking the working directory) up to the moment it would
submit the first job. There the workflow (:mod:`hpcmem.workflow.slurm`) checks each job
against the cluster, writes what it found to a file named by ``HPCMEM_PREFLIGHT_REPORT``
and stops. So the preflight sees exactly the jobs, resources, partitions, accounts and
QOS of the run it precedes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpcmem.errors import HpcmemError
from hpcmem.workflow.slurm import PREFLIGHT_REPORT

__all__ = ["PreflightResult", "WorkflowStopped", "run_preflight"]


class WorkflowStopped(HpcmemError):
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
        raise WorkflowStopped("snakemake not found: install hpcmem[workflow] (make setup)")
    return found


def run_preflight(snakemake_args: list[str]) -> PreflightResult:
    """Run the preflight of ``snakemake SNAKEMAKE_ARGS``; raises WorkflowStopped with the
    last lines of snakemake's output when it stopped before the preflight."""
    with tempfile.TemporaryDirectory(prefix="hpcmem-preflight-") as folder:
        report = Path(folder, "preflight.json")
        command = [_snakemake(), *snakemake_args, "--forceall", "--nolock"]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, **{PREFLIGHT_REPORT: str(report)}))
        if not report.exists():
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            raise WorkflowStopped(f"snakemake stopped before the preflight (exit "
                                  f"{done.returncode}): " + " | ".join(lines[-6:]))
        found = json.loads(report.read_text())
    return PreflightResult(problems=found["problems"], summary=found.get("summary"))
