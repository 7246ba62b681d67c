"""How an ended Slurm run says to redo the rest (hpcmem/workflow/slurm.py): the caller's own
command when it sets HPCMEM_RERUN_HINT (tools/nightly.sh takes HPCMEM_RUN_ID, not
--config), else snakemake's; a hint that is not one line is refused before any job.
test_slurm_workflow.py sees the nightly's hint after a SIGTERM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.inputs import InputError
from hpcmem.workflow import slurm
from hpcmem.workflow.slurm import RERUN_HINT, on_error, rerun_hint

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "rerun the same command with --config run_id=r1 to redo the rest"
NIGHTLY = "rerun the nightly with HPCMEM_RUN_ID=nightly-20261201 (same profile and arguments)"


class Lines:
    """A logger that keeps its error lines."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, line: str) -> None:
        self.errors.append(line)


def test_the_callers_hint_replaces_the_command_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RERUN_HINT, raising=False)
    assert rerun_hint(DEFAULT) == DEFAULT
    monkeypatch.setenv(RERUN_HINT, NIGHTLY)
    assert rerun_hint(DEFAULT) == NIGHTLY
    monkeypatch.setattr(slurm, "_state", slurm._RunState(ended_because="SIGTERM received"))
    logger = Lines()
    on_error(logger, rerun_hint(DEFAULT))
    assert logger.errors == ["hpcmem: the run was ended: SIGTERM received. Finished points "
                             f"are kept: {NIGHTLY}"]
    monkeypatch.setattr(slurm, "_state", slurm._RunState())  # a job failed
    on_error(logger, rerun_hint(DEFAULT))
    assert logger.errors[1] == f"hpcmem: the run failed. Finished points are kept: {NIGHTLY}"


@pytest.mark.parametrize("hint", ["two\nlines", "", "x" * 301, "caf\udce9"],
                         ids=["newline", "empty", "long", "not-utf8"])
def test_a_hint_that_is_not_one_line_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                hint: str) -> None:
    monkeypatch.setenv(RERUN_HINT, hint)
    with pytest.raises(InputError, match=rf"^{RERUN_HINT}: .* is not one line of printable "
                                         r"text \(accepted: 1 to 300 printable"):
        rerun_hint(DEFAULT)


def test_the_workflow_refuses_it_before_any_job(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "--snakefile",
         str(REPO / "workflow" / "Snakefile"), "--directory", str(tmp_path), "--cores", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
        env={**os.environ, RERUN_HINT: "redo it\nrm -rf ~"})  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert done.stdout.splitlines()[-1] == (
        f"hpcmem: error: {RERUN_HINT}: 'redo it\\nrm -rf ~' is not one line of printable text "
        "(accepted: 1 to 300 printable characters: how to redo the rest of an ended run)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".snakemake", "config"]
