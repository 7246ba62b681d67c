"""One run per run folder (hpcmem/workflow/run_lock.py): of processes taking the lock in the
same instant exactly one holds it and the others are refused naming the folder and the
holder; the kernel releases it however the holder ends (SIGTERM, SIGKILL); the holder
leaves nothing behind; only the invocation that runs jobs takes it. test_workflow.py
starts two real runs at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake_interface_executor_plugins.settings import ExecMode

from hpcmem.outputs import OutputPathError
from hpcmem.workflow.run_lock import LOCK_NAME, RunInUseError, runs_jobs, take_run_lock

#: a process that takes the lock on argv[1] when argv[2] exists, says how it went, and
#: holds it until killed
TAKER = """
import os, sys, time
from hpcmem.workflow.run_lock import RunInUseError, take_run_lock
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
try:
    take_run_lock(sys.argv[1])
except RunInUseError as error:
    print(error, flush=True)
    sys.exit(2)
print("held", flush=True)
time.sleep(600)
"""


def taker(run: Path, go: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", TAKER, str(run), str(go)],
                            stdout=subprocess.PIPE, text=True)


def holding(run: Path, tmp_path: Path) -> subprocess.Popen[str]:
    """A process holding the lock on ``run``."""
    go = tmp_path / "go-now"
    go.touch()
    process = taker(run, go)
    assert process.stdout.readline() == "held\n"
    return process


@pytest.mark.parametrize("attempt", range(3))
def test_of_runs_started_in_one_instant_exactly_one_holds(tmp_path: Path, attempt: int) -> None:
    run, go = tmp_path / "results" / "r1", tmp_path / "go"
    processes = [taker(run, go) for _ in range(6)]
    time.sleep(0.5)  # all waiting at the barrier
    go.touch()
    firsts = {process: process.stdout.readline() for process in processes}
    holders = [process for process, line in firsts.items() if line == "held\n"]
    assert len(holders) == 1, firsts
    for process, line in firsts.items():
        if process not in holders:
            assert process.wait(timeout=30) == 2
            assert line.startswith(f"run folder {run}: in use by another run of the workflow "
                                   f"(snakemake process {holders[0].pid} on "
                                   f"{socket.gethostname()}, since "), line
    holders[0].kill()
    holders[0].wait()


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL])
def test_the_lock_is_free_again_however_its_holder_ends(tmp_path: Path, ending: int) -> None:
    run = tmp_path / "r1"
    process = holding(run, tmp_path)
    with pytest.raises(RunInUseError, match=rf"snakemake process {process.pid} "):
        take_run_lock(run)
    process.send_signal(ending)
    process.wait()
    lock = take_run_lock(run)  # the file is left behind, the lock is not
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_holder_leaves_nothing_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    lock = take_run_lock(Path("results", "r1"))
    assert lock.made == [tmp_path / "results", tmp_path / "results" / "r1"]
    monkeypatch.chdir("/")  # snakemake goes back where it started before it exits
    lock.release()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "results" / "r1").mkdir(parents=True)
    lock = take_run_lock(tmp_path / "results" / "r1")
    (tmp_path / "results" / "r1" / "summary").mkdir()  # what a run wrote is kept
    lock.release()
    assert [p.name for p in (tmp_path / "results" / "r1").iterdir()] == ["summary"]


def test_a_lock_file_that_is_not_one_is_refused_and_left_alone(tmp_path: Path) -> None:
    run, outside = tmp_path / "results" / "r1", tmp_path / "precious"
    run.mkdir(parents=True)
    outside.write_text("kept\n")
    (run / LOCK_NAME).symlink_to(outside)
    with pytest.raises(OutputPathError, match=rf"^run folder {run}: {LOCK_NAME} is a symbolic "
                                              "link, not the run's lock file: remove it$"):
        take_run_lock(run)
    assert outside.read_text() == "kept\n"
    (run / LOCK_NAME).unlink()
    os.mkfifo(run / LOCK_NAME)
    with pytest.raises(OutputPathError, match=rf"{LOCK_NAME} is not a file: remove it$"):
        take_run_lock(run)


def invocation(mode: ExecMode = ExecMode.DEFAULT, dryrun: bool = False) -> SimpleNamespace:
    """What runs_jobs reads of Snakemake's workflow object."""
    return SimpleNamespace(exec_mode=mode, output_settings=SimpleNamespace(dryrun=dryrun))


@pytest.mark.parametrize(("workflow", "argv", "locks"), [
    (invocation(), ["--cores", "2"], True),
    (invocation(), ["--unlock"], True),  # refused while a run holds the folder
    (invocation(), ["--touch"], True),
    (invocation(), ["--nolock", "--forceall"], False),  # hpcmem preflight
    (invocation(), ["--lint"], False),
    (invocation(), ["--summary"], False),
    (invocation(), ["--dag"], False),
    (invocation(dryrun=True), ["-n"], False),
    (invocation(ExecMode.SUBPROCESS), ["--mode", "subprocess"], False),  # a job
    (invocation(ExecMode.REMOTE), ["--mode", "remote"], False),  # a job on a Slurm node
    (invocation(), ["not", "--a-snakemake-option"], True),  # the API: when in doubt, lock
], ids=["run", "unlock", "touch", "nolock", "lint", "summary", "dag", "dry-run", "subprocess",
        "remote", "unknown"])  # fmt: skip
def test_only_the_invocation_that_runs_jobs_locks(workflow: SimpleNamespace, argv: list[str],
                                                  locks: bool) -> None:
    assert runs_jobs(workflow, argv) is locks
