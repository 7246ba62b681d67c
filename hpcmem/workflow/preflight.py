"""``hpcmem preflight``: the workflow's own preflight, with nothing submitted.

Runs snakemake with the caller's profile and configuration over every job of the sweep
(``--forceall``, without locking the working directory) up to the moment it would
submit the first job. There the workflow (:mod:`hpcmem.workflow.slurm`) checks each job
against the cluster, writes what it found to a file named by ``HPCMEM_PREFLIGHT_REPORT``
and stops. So the preflight sees exactly the jobs, resources, partitions, accounts and
QOS of the run it precedes.

Before that, :func:`check_profile` reads the files Snakemake reads first (the profile's
settings and its sweep files) with hpcmem's own YAML reader, so that a file that is not a
mapping, not UTF-8 or holds an alias bomb is one line naming it, at once, where Snakemake
would take minutes and gigabytes expanding the bomb.
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
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.inputs import InputError, refused, yaml_mapping
from hpcmem.textfiles import TextFileError
from hpcmem.workflow.refusal import REFUSED
from hpcmem.workflow.slurm import PREFLIGHT_REPORT

__all__ = ["PreflightResult", "WorkflowStopped", "check_profile", "run_preflight"]

#: where snakemake's account of an error starts: ``WorkflowError in file ...``,
#: ``Error: ...``, ``snakemake: error: ...`` (argparse, after its usage text)
_ERROR_LINE = re.compile(r"^(?:\w*Error\b|[\w.-]+: error:)")
#: the header of a WorkflowError raised in a Snakefile: where, not why
_WHERE_LINE = re.compile(r"^\w*Error in file .*, line \d+:$")
#: a traceback frame: the end of the account
_FRAME_LINE = re.compile(r"^\s*(?:File \"|Traceback \()")


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


def _sweep_files(folder: Path, named: Any) -> list[Path]:
    """The files a profile's ``configfile`` names, found as Snakemake finds them: one name
    in the profile's folder first, a list of names as given."""
    if named is None:
        return []
    if isinstance(named, list):
        return [Path(str(name)) for name in named]
    name = os.path.expanduser(os.path.expandvars(str(named)))
    return [folder / name if (folder / name).exists() else Path(name)]


def _profile_files(profile: str) -> tuple[Path, Path] | None:
    """The folder and settings file Snakemake reads for ``profile``, or None."""
    from snakemake.cli import get_profile_dir

    try:
        return get_profile_dir(profile) if profile else None
    except (OSError, ValueError):  # a name too long for a path, or holding NUL
        return None


def _mapping(path: Path, field: str) -> dict[str, Any]:
    try:
        return yaml_mapping(path)
    except TextFileError as error:
        raise InputError(f"{field}: {error}") from None


def check_profile(profile: str | None, configfiles: list[str] | None = None, *,
                  field: str = "--profile") -> None:
    """Read what ``snakemake --profile PROFILE [--configfile FILE...]`` reads first: the
    profile's settings (found as Snakemake finds them), then the sweep files (those given,
    else those the profile names). Each must be a mapping in UTF-8 YAML without aliases;
    BadInputError names ``field`` (or ``--configfile``) and the file."""
    from snakemake.common import get_appdirs

    sweeps = [Path(name) for name in configfiles or ()]
    if profile is not None:
        found = _profile_files(profile)
        if found is None:
            dirs = get_appdirs()
            raise refused(field, profile, "is not a profile",
                          "a folder holding config.yaml, or the name of one in the current "
                          f"folder, {dirs.user_config_dir} or {dirs.site_config_dir}")
        folder, settings = found
        named = _sweep_files(folder, _mapping(settings, field).get("configfile"))
        sweeps = sweeps or named
    for path in sweeps:
        _mapping(path, "--configfile" if configfiles else field)


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
    """Run the preflight of ``snakemake SNAKEMAKE_ARGS``; raises WorkflowStopped with what
    snakemake said when it stopped before the preflight."""
    with tempfile.TemporaryDirectory(prefix="hpcmem-preflight-") as folder:
        report = Path(folder, "preflight.json")
        command = [_snakemake(), *snakemake_args, "--forceall", "--nolock"]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, **{PREFLIGHT_REPORT: str(report)}))
        if not report.exists():
            raise WorkflowStopped(f"snakemake stopped before the preflight (exit "
                                  f"{done.returncode}): {_why_stopped(done.stdout)}")
        found = json.loads(report.read_text())
    return PreflightResult(problems=found["problems"], summary=found.get("summary"))
