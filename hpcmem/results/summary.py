"""The summary ``hpcmem aggregate`` writes, as a shape and read back: its columns, the
:class:`Summary` of an output folder, and one benchmark's rows of it.

The summary has one column per coordinate and metric of every registered benchmark
(:mod:`hpcmem.results.registry`; a benchmark's rows leave the others' empty). Reading it
back checks its columns and every point's ``samples`` (JSON of finite numbers), so that
neither the check nor the report meets a corrupt one halfway through.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.record.samples import SamplesError, read_samples
from hpcmem.results.registry import BENCHMARKS
from hpcmem.results.virtual import VM_COLUMN

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COORDINATES",
    "INTEGER_COLUMNS",
    "METRICS",
    "NODE_COLUMNS",
    "REJECTED_COLUMNS",
    "SKIPPED_COLUMNS",
    "SUMMARY_COLUMNS",
    "Summary",
    "benchmark_points",
    "read_summary",
    "run_id",
]

#: summary columns: every benchmark's coordinates and metrics (a benchmark's rows leave the
#: others' empty)
COORDINATES = list(dict.fromkeys(c.name for b in BENCHMARKS.values() for c in b.coordinates))
METRICS = list(dict.fromkeys(m.name for b in BENCHMARKS.values() for m in b.metrics))
INTEGER_COLUMNS = [
    *dict.fromkeys(c.name for b in BENCHMARKS.values() for c in b.coordinates if c.integer),
    "repeats",
]
#: summary columns added after the first summaries were written, with their value in those
NODE_COLUMNS = {"samples": "", "shared_cores": None, "other_busy_cpus": None, VM_COLUMN: ""}
SUMMARY_COLUMNS = [
    "point", "benchmark", *COORDINATES,
    "emulated", *METRICS, "repeats", "run_ids", "hosts", "systems", *NODE_COLUMNS,
]
#: ``budget_minimum_bytes``: a refused GPU budget's measured minimum, empty for other records
SKIPPED_COLUMNS = ["file", "line", "benchmark", "status", "point", "reason", "run_id", "host",
                   "budget_minimum_bytes"]
REJECTED_COLUMNS = ["file", "line", "error"]


@dataclass
class Summary:
    """An aggregate output folder read back: the summary and what was left out."""

    points: pd.DataFrame
    skipped: pd.DataFrame
    rejected: pd.DataFrame
    metadata: dict[str, Any]
    folder: Path


def run_id(summary: Summary) -> str:
    """The run a summary holds, as its verdict and history name it: its run ids joined."""
    return "+".join(sorted(summary.metadata.get("run_ids") or [])) or "unknown"


def benchmark_points(summary: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    """The summary rows of one benchmark."""
    return summary[summary["benchmark"] == benchmark].reset_index(drop=True)


def _check_samples(points: pd.DataFrame, file: Path) -> None:
    """ValueError naming ``file``, the row, its point and the text of the first ``samples``
    cell that is not samples."""
    for row, point, text in zip(points.index, points["point"], points["samples"], strict=True):
        try:
            read_samples(text)
        except SamplesError as error:
            raise ValueError(f"{file}: row {row} (point {point}): samples: {error}") from None


def read_summary(path: str | os.PathLike[str]) -> Summary:
    """Read an ``hpcmem aggregate`` output folder (or its ``summary.parquet``).

    Raises ``FileNotFoundError`` or ``ValueError`` with a one-line message naming the file.
    """
    import pandas as pd

    folder = Path(path)
    if folder.is_file() or folder.suffix == ".parquet":
        folder = folder.parent
    parts = {}
    for name in ("summary.parquet", "skipped.csv", "rejected.csv", "metadata.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder}: no {name} (make it with `hpcmem aggregate RESULTS --out {folder}`)"
            )
        try:
            if name.endswith(".parquet"):
                parts[name] = pd.read_parquet(folder / name)
            elif name.endswith(".csv"):
                parts[name] = pd.read_csv(folder / name, keep_default_na=False)
            else:
                parts[name] = json.loads((folder / name).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{folder / name}: unreadable ({error})") from None
    points = parts["summary.parquet"]
    for name, value in NODE_COLUMNS.items():
        if name not in points.columns:
            points[name] = value
    missing = set(SUMMARY_COLUMNS) - set(points.columns)
    if missing:
        names = ", ".join(sorted(missing))
        raise ValueError(f"{folder / 'summary.parquet'}: missing columns {names}")
    _check_samples(points, folder / "summary.parquet")
    return Summary(
        points=parts["summary.parquet"],
        skipped=parts["skipped.csv"],
        rejected=parts["rejected.csv"],
        metadata=parts["metadata.json"],
        folder=folder,
    )
