"""A file system that fills while a command writes: one line, exit 2, nothing written half,
nothing already there lost. A file-size limit (RLIMIT_FSIZE) stands in for the full disk:
the write fails with EFBIG exactly as it would with ENOSPC."""

from __future__ import annotations

import errno
import resource
import sqlite3
import subprocess
from pathlib import Path

import pytest

from hpcmem.results.history import History, RunInfo

RECORDS = Path(__file__).parent / "fixtures" / "records"
REFERENCES = "references:\n  '*:*':\n    'collectives/*/latency_us.avg': [1.0, -0.99, 1000, us]\n"


def _small_files(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _hpcmem(hpcmem_exe: str, *argv: str, limit: int | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hpcmem_exe, *argv], capture_output=True, text=True, timeout=120,
                          preexec_fn=None if limit is None else lambda: _small_files(limit))


def _one_error_line(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr


def test_aggregate_keeps_the_previous_outputs(hpcmem_exe: str, tmp_path: Path) -> None:
    out = tmp_path / "summary"
    first = _hpcmem(hpcmem_exe, "aggregate", str(RECORDS / "collectives"), "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = _hpcmem(hpcmem_exe, "aggregate", str(RECORDS), "--out", str(out), limit=2048)
    _one_error_line(done, "cannot write (File too large)")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_check_writes_no_verdict_when_the_history_fails(hpcmem_exe: str, tmp_path: Path
                                                        ) -> None:
    summary, history = tmp_path / "summary", tmp_path / "history"
    assert _hpcmem(hpcmem_exe, "aggregate", str(RECORDS / "collectives"),
                   "--out", str(summary)).returncode == 0
    refs = tmp_path / "refs.yaml"
    refs.write_text(REFERENCES)
    verdict = tmp_path / "verdict.json"
    argv = ["check", str(summary), "--references", str(refs), "--system", "s:p",
            "--history", str(history), "--verdict-out", str(verdict)]
    done = _hpcmem(hpcmem_exe, *argv, limit=4096)
    _one_error_line(done, "--history:")
    assert not verdict.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    database = history / "history.sqlite"
    if database.exists():
        with sqlite3.connect(database) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            assert "runs" not in tables or db.execute("SELECT COUNT(*) FROM runs").fetchone() \
                == (0,)
    again = _hpcmem(hpcmem_exe, *argv)
    assert again.returncode == 0, again.stderr
    assert "this run appended" in again.stdout and verdict.exists()


def test_a_verdict_that_fails_inside_the_transaction_appends_nothing(tmp_path: Path) -> None:
    store = History(tmp_path)
    run = RunInfo("r1", "s:p", None, "now", None, [], "1", None, [], "PASS")

    def full_disk(appended: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        store.append(run, {"a/latency_us.avg": (1.0, "us")}, then=full_disk)
    assert store.medians("s:p", 5, exclude_run="other") == {}
    assert store.append(run, {"a/latency_us.avg": (1.0, "us")})
    assert store.medians("s:p", 5, exclude_run="other") != {}
