"""One run per run folder at a time, decided before anything is built or installed.

Snakemake's own lock (``.snakemake/locks``) is looked at, then written: two identical runs
started in the same instant both pass it, and both build and install the run's
environment, the second under the first one's jobs. The workflow therefore takes a lock of
its own while Snakemake reads the Snakefile, before the DAG exists: ``flock`` on
``RUN/run.lock`` (:data:`LOCK_NAME`), which the kernel grants to one process only, holds
for as long as that process lives and releases however it ends (exit, error, SIGTERM,
SIGKILL), so a killed run never leaves it taken. The file says who holds it (process,
host, start); a second run is refused naming the run folder and the holder, whatever the
timing. At exit the holder removes the file, and the folders it made to hold it when
they are still empty (a run refused before any job leaves nothing). :func:`held_by` says
who holds a run folder without taking it (``tools/nightly.sh`` asks before it starts).

Only the invocation that runs the jobs takes it (:func:`runs_jobs`): not Snakemake's job
processes, nor a dry run, ``--nolock`` (``hpcmem preflight``), ``--lint``, ``--summary``,
the listings or the graphs, which read the workflow and run nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import errno
import fcntl
import io
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError, clip
from hpcmem.outputs import OutputPathError, write_errors

__all__ = ["LOCK_NAME", "RunInUseError", "RunLock", "held_by", "hold_run_folder", "runs_jobs",
           "take_run_lock"]

#: the lock file, in the run folder
LOCK_NAME = "run.lock"
#: Snakemake options (its argument names) under which it reads the workflow but runs none
#: of its jobs, or is told not to lock: any other invocation takes the lock
_NO_JOBS = ("dryrun", "nolock", "lint", "list_target_rules", "list_rules",
            "print_compilation", "dag", "rulegraph", "filegraph", "d3dag", "summary",
            "detailed_summary", "list_changes", "list_input_changes", "list_params_changes",
            "list_untracked")  # fmt: skip
#: how long a refused run waits for a holder that has just taken the lock to say who it is
_HOLDER_WAIT = 2.0


class RunInUseError(BadInputError):
    """Another run of the workflow holds the run folder."""


@dataclass
class RunLock:
    """The lock on one run folder, held through the open file ``fd``."""

    path: Path
    fd: int
    made: list[Path]  # the folders made to hold the file, outermost first

    def release(self) -> None:
        """Remove the file (while still holding it), let it go, and remove the folders made
        for it that hold nothing else."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)
        for folder in reversed(self.made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _holder() -> dict[str, Any]:
    """Who takes the lock: this process, its host and the time."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": now}


def _alive_here(holder: dict[str, Any]) -> bool:
    """Whether ``holder`` can be the process holding the lock: any process on another host,
    a live one on this host."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    return True


def _describe_holder(fd: int) -> str:
    """Who holds the lock, as its file says. A holder that has just taken it may not have
    written itself yet (the file is empty, or names the previous, dead holder): wait a
    moment for it."""
    deadline = time.monotonic() + _HOLDER_WAIT
    while True:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            holder = None
        if isinstance(holder, dict) and _alive_here(holder):
            return (f"snakemake process {holder.get('pid')} on {holder.get('host')}, since "
                    f"{holder.get('since')}")
        if time.monotonic() > deadline:
            return f"a process that has not written who it is in {LOCK_NAME}"
        time.sleep(0.05)


def held_by(folder: str | os.PathLike[str]) -> str | None:
    """Who holds the lock on the run folder ``folder`` now (as :class:`RunInUseError` names
    it), or None; makes and changes nothing (a missing folder or lock file: nobody). The
    lock is tried shared, for as long as an open and a close take."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME,
                     os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe_holder(fd)
    finally:
        os.close(fd)
    return None


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those above it that do not exist yet, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def take_run_lock(folder: str | os.PathLike[str]) -> RunLock:
    """The lock on the run folder ``folder`` (made if missing), or RunInUseError naming the
    folder and its holder when another process holds it (OutputPathError: the folder
    cannot be made or written in)."""
    run = Path(folder)
    path = run.absolute() / LOCK_NAME  # snakemake leaves its working directory at exit
    made = _missing_folders(run.absolute())
    while True:
        with write_errors(f"run folder {run}"):
            run.mkdir(parents=True, exist_ok=True)
            try:  # never through a symbolic link: what it leads to is not the run's
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o644)
            except FileNotFoundError:  # a releasing holder removed the folder it had made
                continue
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise OutputPathError(f"run folder {run}: {LOCK_NAME} is a symbolic "
                                          "link, not the run's lock file: remove it") from None
                raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputPathError(f"run folder {run}: {LOCK_NAME} is not a file: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise RunInUseError(
                f"run folder {clip(str(run))}: in use by another run of the workflow "
                f"({holder}): wait for it to end, or give this run another run_id") from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (opened.st_dev,
                                                                        opened.st_ino):
            break
        os.close(fd)  # a releasing holder removed this file after it was opened: again
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder()) + "\n").encode(), 0)
    return RunLock(path=path, fd=fd, made=made)


def _snakemake_args(argv: Sequence[str]) -> Any | None:
    """Snakemake's own reading of its command line ``argv`` (its profile applied), or None
    when ``argv`` is not a snakemake command line (the workflow run through the API)."""
    from snakemake.cli import parse_args

    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return parse_args(list(argv))[1]
    except (Exception, SystemExit):
        return None


def runs_jobs(workflow: Any, argv: Sequence[str]) -> bool:
    """Whether this snakemake invocation (its ``workflow`` object while the Snakefile is
    read, its command line ``argv``) is the one that runs the jobs and locks: Snakemake's
    main process, not a dry run or an invocation of :data:`_NO_JOBS`. When in doubt, yes."""
    from snakemake_interface_executor_plugins.settings import ExecMode

    if workflow.exec_mode != ExecMode.DEFAULT or workflow.output_settings.dryrun:
        return False
    args = _snakemake_args(argv)
    return args is None or not any(getattr(args, name, None) for name in _NO_JOBS)


def hold_run_folder(workflow: Any, folder: str | os.PathLike[str]) -> RunLock | None:
    """The lock on ``folder`` for this invocation, released when the process exits; None
    when it runs no job (:func:`runs_jobs`); RunInUseError when another run holds it."""
    if not runs_jobs(workflow, sys.argv[1:]):
        return None
    lock = take_run_lock(folder)
    atexit.register(lock.release)
    return lock
