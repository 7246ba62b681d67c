"""The run history: figures of past runs in SQLite, for comparing a run with its recent past.

One database, ``history.sqlite``, in the history folder. A run is identified by
its ``run_id`` and the ``system:partition`` it ran on; it is appended in one
transaction (all its figures or none), and appending the same run again changes
nothing, so re-checking a summary is idempotent. The median of the last N runs is
taken per figure over the runs of the same system, newest first, excluding the
run being checked.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HISTORY_FILE", "History", "HistoryMedian", "RunInfo"]

HISTORY_FILE = "history.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT NOT NULL,
    system TEXT NOT NULL,
    timestamp TEXT,
    checked_at TEXT NOT NULL,
    git_sha TEXT,
    hosts TEXT,
    hpcmem_version TEXT,
    container TEXT,
    slurm_job_ids TEXT,
    verdict TEXT NOT NULL,
    PRIMARY KEY (run_id, system)
);
CREATE TABLE IF NOT EXISTS figures (
    run_id TEXT NOT NULL,
    system TEXT NOT NULL,
    figure TEXT NOT NULL,
    value REAL NOT NULL,
    unit TEXT NOT NULL,
    PRIMARY KEY (run_id, system, figure),
    FOREIGN KEY (run_id, system) REFERENCES runs (run_id, system)
);
"""


@dataclass(frozen=True)
class RunInfo:
    """The metadata stored with a run."""

    run_id: str
    system: str
    timestamp: str | None
    checked_at: str
    git_sha: str | None
    hosts: list[str]
    hpcmem_version: str | None
    container: Any
    slurm_job_ids: list[str]
    verdict: str


@dataclass(frozen=True)
class HistoryMedian:
    """The median of one figure over past runs, and how many runs it was taken over."""

    value: float
    runs: int


class History:
    """The history store in folder ``path`` (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.folder = Path(path)
        self.file = self.folder / HISTORY_FILE

    def _connect(self) -> sqlite3.Connection:
        self.folder.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.file, timeout=60, isolation_level=None)
        connection.executescript(_SCHEMA)
        return connection

    def medians(self, system: str, last: int, exclude_run: str) -> dict[str, HistoryMedian]:
        """Per figure, its median over the newest ``last`` runs on ``system``, except one.

        ``exclude_run`` (the run being checked) is left out.
        """
        if not self.file.exists():
            return {}
        with closing(self._connect()) as db:
            runs = [
                row[0]
                for row in db.execute(
                    "SELECT run_id FROM runs WHERE system = ? AND run_id != ? "
                    "ORDER BY timestamp DESC, checked_at DESC LIMIT ?",
                    (system, exclude_run, last),
                )
            ]
            values: dict[str, list[float]] = {}
            marks = ",".join("?" * len(runs))
            query = (
                f"SELECT figure, value FROM figures WHERE system = ? AND run_id IN ({marks})"
            )
            for figure, value in db.execute(query, (system, *runs)):
                values.setdefault(figure, []).append(value)
        return {
            figure: HistoryMedian(statistics.median(vals), len(vals))
            for figure, vals in values.items()
        }

    def append(self, run: RunInfo, figures: Mapping[str, tuple[float, str]],
               then: Callable[[bool], None] = lambda appended: None) -> bool:
        """Record ``run`` and its ``figures`` (name -> (value, unit)) in one transaction.

        Returns False, changing nothing, when the run is already recorded. ``then`` is
        called inside the transaction with that answer; when it raises, nothing is appended.
        """
        return self.append_all([(run, figures)], then)

    def append_all(self, runs: Sequence[tuple[RunInfo, Mapping[str, tuple[float, str]]]],
                   then: Callable[[bool], None] = lambda appended: None) -> bool:
        """Record several ``(run, figures)`` (one per system) in one transaction, skipping
        runs already recorded; True when any was new. ``then`` as for :meth:`append`."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                appended = False
                for run, figures in runs:
                    exists = db.execute(
                        "SELECT 1 FROM runs WHERE run_id = ? AND system = ?",
                        (run.run_id, run.system),
                    ).fetchone()
                    if exists:
                        continue
                    db.execute(
                        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            run.run_id, run.system, run.timestamp, run.checked_at,
                            run.git_sha, json.dumps(run.hosts), run.hpcmem_version,
                            json.dumps(run.container), json.dumps(run.slurm_job_ids),
                            run.verdict,
                        ),
                    )
                    db.executemany(
                        "INSERT INTO figures VALUES (?, ?, ?, ?, ?)",
                        _figure_rows(run, figures.items()),
                    )
                    appended = True
                then(appended)
                db.execute("COMMIT" if appended else "ROLLBACK")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return appended


def _figure_rows(
    run: RunInfo, figures: Iterable[tuple[str, tuple[float, str]]]
) -> Iterable[tuple[str, str, str, float, str]]:
    for name, (value, unit) in figures:
        yield run.run_id, run.system, name, float(value), unit
