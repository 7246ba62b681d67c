"""The run history: figures of past runs in SQLite, for comparing a run with its recent past.

One database, ``history.sqlite``, in the history folder. A run is identified by
its ``run_id`` and the ``system:partition`` it ran on; it is appended in one
transaction (all its figures or none), and appending the same run again changes
nothing, so re-checking a summary is idempotent. Each figure is stored with its samples
(every repeat's value), whether its point shared cores with other work, and its verdict.
A figure's :class:`Baseline` is taken over the last N runs of the same system, newest
first, excluding the run being checked: the median of their values, their samples pooled,
and how many of them shared cores; its timeline (:meth:`History.timelines`) is each of the
last runs' value and verdict, for the report. A store made before samples (or verdicts)
were kept gains the columns on first use; its figures count as one sample each, node state
and verdict unknown. A stored figure whose value is not a finite number, whose samples are
not a JSON list of them, or whose verdict is not one, raises :class:`HistoryError` naming
the store, the run, the figure, the field and the value: a baseline is never taken
over what cannot be read. A check compares with at most :data:`MAX_LAST` runs.
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

from hpcmem.errors import HpcmemError, clip
from hpcmem.record.samples import SamplesError, finite_number, read_values
from hpcmem.results.verdict import VERDICTS

__all__ = ["HISTORY_FILE", "MAX_LAST", "Baseline", "Figure", "History", "HistoryError",
           "PastFigure", "RunInfo"]

HISTORY_FILE = "history.sqlite"
#: the most past runs a check compares with (``--last``, the references' ``history.last``):
#: years of nightly runs
MAX_LAST = 1000

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
    samples TEXT,
    shared_cores INTEGER,
    PRIMARY KEY (run_id, system, figure),
    FOREIGN KEY (run_id, system) REFERENCES runs (run_id, system)
);
"""


class HistoryError(HpcmemError, ValueError):
    """A stored figure that cannot be read back; the message names where and what."""


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


#: columns of ``figures`` a store made by an earlier version lacks
_ADDED_COLUMNS = {"samples": "TEXT", "shared_cores": "INTEGER", "verdict": "TEXT"}


@dataclass(frozen=True)
class Figure:
    """One figure of a run as stored: its value, unit, samples and node state."""

    value: float
    unit: str
    samples: tuple[float, ...] = ()
    shared_cores: bool | None = None
    #: its verdict in that run (None: stored before verdicts were)
    verdict: str | None = None


@dataclass(frozen=True)
class PastFigure:
    """One figure as one run stored it, for its timeline."""

    run_id: str
    timestamp: str | None
    figure: Figure


@dataclass(frozen=True)
class Baseline:
    """One figure over past runs: the median of their values, how many runs, their samples
    pooled, and how many of those runs shared cores with other work."""

    value: float
    runs: int
    samples: tuple[float, ...] = ()
    shared_runs: int = 0


class History:
    """The history store in folder ``path`` (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.folder = Path(path)
        self.file = self.folder / HISTORY_FILE

    def _connect(self) -> sqlite3.Connection:
        self.folder.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.file, timeout=60, isolation_level=None)
        connection.executescript(_SCHEMA)
        have = {row[1] for row in connection.execute("PRAGMA table_info(figures)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in have:
                connection.execute(f"ALTER TABLE figures ADD COLUMN {name} {kind}")
        return connection

    def baselines(self, system: str, last: int, exclude_run: str) -> dict[str, Baseline]:
        """Per figure, its :class:`Baseline` over the newest ``last`` runs on ``system``.

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
            found: dict[str, list[Figure]] = {}
            marks = ",".join("?" * len(runs))
            query = (
                "SELECT run_id, figure, value, unit, samples, shared_cores FROM figures "
                f"WHERE system = ? AND run_id IN ({marks})"
            )
            for run, figure, *columns in db.execute(query, (system, *runs)):
                where = f"{self.file}: run {run!r} on {system}, figure {figure}"
                found.setdefault(figure, []).append(_stored(where, *columns))
        return {figure: _baseline(rows) for figure, rows in found.items()}

    def timelines(self, system: str, figures: Iterable[str], last: int
                  ) -> dict[str, list[PastFigure]]:
        """Each of ``figures`` over the newest ``last`` runs on ``system``, oldest first
        (figures no run has are left out)."""
        wanted = set(figures)
        if not self.file.exists() or not wanted:
            return {}
        with closing(self._connect()) as db:
            runs = dict(db.execute(
                "SELECT run_id, timestamp FROM runs WHERE system = ? "
                "ORDER BY timestamp DESC, checked_at DESC LIMIT ?", (system, last)).fetchall())
            order = {run: index for index, run in enumerate(reversed(list(runs)))}
            found: dict[str, list[PastFigure]] = {}
            marks = ",".join("?" * len(runs))
            query = ("SELECT run_id, figure, value, unit, samples, shared_cores, verdict "
                     f"FROM figures WHERE system = ? AND run_id IN ({marks})")
            for run, figure, *columns in db.execute(query, (system, *runs)):
                if figure in wanted:
                    where = f"{self.file}: run {run!r} on {system}, figure {figure}"
                    found.setdefault(figure, []).append(
                        PastFigure(run, runs[run], _stored(where, *columns)))
        return {figure: sorted(past, key=lambda p: order[p.run_id])
                for figure, past in found.items()}

    def append(self, run: RunInfo, figures: Mapping[str, Figure],
               then: Callable[[bool], None] = lambda appended: None) -> bool:
        """Record ``run`` and its ``figures`` (name -> :class:`Figure`) in one transaction.

        Returns False, changing nothing, when the run is already recorded. ``then`` is
        called inside the transaction with that answer; when it raises, nothing is appended.
        """
        return self.append_all([(run, figures)], then)

    def append_all(self, runs: Sequence[tuple[RunInfo, Mapping[str, Figure]]],
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
                        "INSERT INTO figures (run_id, system, figure, value, unit, samples, "
                        "shared_cores, verdict) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        _figure_rows(run, figures.items()),
                    )
                    appended = True
                then(appended)
                db.execute("COMMIT" if appended else "ROLLBACK")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return appended


def _stored(where: str, value: Any, unit: str, samples: Any, shared: Any,
            verdict: Any = None) -> Figure:
    """A stored figure's columns read back (no samples: the value is the one sample);
    HistoryError names ``where``, the field and the value that cannot be read."""
    if not finite_number(value):
        raise HistoryError(f"{where}: value: {clip(repr(value), 60)} is not a finite number")
    if verdict is not None and verdict not in VERDICTS:
        raise HistoryError(f"{where}: verdict: {clip(repr(verdict), 60)} is not one of "
                           f"{', '.join(VERDICTS)}")
    try:
        values = read_values(samples) if samples else [float(value)]
    except SamplesError as error:
        raise HistoryError(f"{where}: samples: {error}") from None
    return Figure(float(value), unit, tuple(values), None if shared is None else bool(shared),
                  verdict)


def _baseline(rows: list[Figure]) -> Baseline:
    """The baseline of one figure from its stored rows."""
    return Baseline(
        value=statistics.median(row.value for row in rows),
        runs=len(rows),
        samples=tuple(s for row in rows for s in row.samples),
        shared_runs=sum(1 for row in rows if row.shared_cores),
    )


def _figure_rows(
    run: RunInfo, figures: Iterable[tuple[str, Figure]]
) -> Iterable[tuple[str, str, str, float, str, str, int | None, str | None]]:
    for name, figure in figures:
        shared = None if figure.shared_cores is None else int(figure.shared_cores)
        yield (run.run_id, run.system, name, float(figure.value), figure.unit,
               json.dumps(list(figure.samples or [figure.value])), shared, figure.verdict)
