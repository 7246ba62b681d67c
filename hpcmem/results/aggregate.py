"""Aggregate result records into one row per sweep point (pandas).

Every record is validated against the record schema first. Valid ``ok`` records
are grouped by point — the benchmark and its sweep coordinates — and reduced to
medians over repeats; every repeat's value is kept (``samples``, :mod:`hpcmem.record.samples`)
with the node state the point was measured in (``shared_cores``, ``other_busy_cpus``). A
point measured in a virtual machine is a point of its own (``vm_topology``,
:mod:`hpcmem.results.virtual`), left out of the benchmarks' derived tables.
Invalid lines (not JSON, or schema violations) go to
``rejected.csv`` with ``file:line`` and the message; ``failed`` and ``skipped``
records (and ``ok`` records their benchmark's sanity check refuses, such as
collectives whose result was not validated) go to ``skipped.csv`` with their reason.
Neither is ever averaged in. Coordinates, point keys and metrics come from each
benchmark's spec (:mod:`hpcmem.results.registry`): a metric's summary column is its name. A
line of a producer that writes its own shape of record (the peers' hf_offload.py) is read as
the contract's first (``Benchmark.adopt``), and the figures a benchmark derives across its
points (the peers' ratio to ZeRO-Offload) are added to its rows of the summary.

Outputs in the ``--out`` folder, each written atomically (temp name + rename):

``summary.parquet`` / ``summary.csv``
    one row per point, medians over repeats, ``point`` is its key; ``samples`` (JSON: metric
    -> every repeat's value), ``shared_cores`` (any of its records shared cores with other
    work), ``other_busy_cpus`` (the most other work seen, in CPUs) and ``vm_topology`` (the
    virtual machine it ran in, "" on a real node)
the benchmarks' own tables, of the points measured on real nodes
    ``collectives_latency.csv`` (median average latency per buffer kind),
    ``collectives_speedup.csv`` (each buffer kind's speedup over ``numpy`` buffers),
    ``train_step_time.csv`` (step time per policy, its ratio to the ``um`` and ``cuda`` presets)
    and ``peers_step_time.csv`` (each peer's step time, its ratio to ZeRO-Offload, the
    fastest peer tool and ``cuda``)
``rejected.csv``, ``skipped.csv``, ``metadata.json``
    the records left out, with reasons, and the run metadata
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.errors import clip
from hpcmem.outputs import check_output_dir, write_errors
from hpcmem.record.jsonl import atomic_open, read_lines
from hpcmem.record.provenance import utc_now
from hpcmem.record.samples import merge_samples, record_samples
from hpcmem.results.registry import BENCHMARKS, REPORTS, adopt
from hpcmem.results.schema import validate_record
from hpcmem.results.summary import (
    COORDINATES,
    INTEGER_COLUMNS,
    METRICS,
    NODE_COLUMNS,
    REJECTED_COLUMNS,
    SKIPPED_COLUMNS,
    SUMMARY_COLUMNS,
    benchmark_points,
)
from hpcmem.results.virtual import VM_COLUMN, point_key, split, vm_name

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "AggregateResult",
    "Loaded",
    "aggregate",
    "find_inputs",
    "load_records",
    "summarize",
    "write_outputs",
]

class _Distinct:
    """Distinct values in the order first seen (dicts and lists compared by content)."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._seen: set[Any] = set()

    def add(self, value: Any) -> None:
        if value is None:
            return
        key = json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
        if key not in self._seen:
            self._seen.add(key)
            self.values.append(value)


#: metadata.json's lists of distinct values -> the record field each comes from
_METADATA_FIELDS = {
    "run_ids": "run_id", "hosts": "host", "git_shas": "git_sha",
    "hpcmem_versions": "hpcmem_version", "containers": "container",
    "slurm_job_ids": "slurm_job_id", "systems": "system",
    **{key: name for spec in BENCHMARKS.values() for key, name in spec.metadata.items()},
}
#: with the point key, what makes a record one measurement: the same again is a duplicate
_IDENTITY = ("run_id", "host", "slurm_job_id", "timestamp", "status")
_ROW_COLUMNS = ["point", "benchmark", *COORDINATES, "emulated", *METRICS, "run_id", "host",
                "system", *NODE_COLUMNS]


@dataclass
class Loaded:
    """Records read from the inputs, one at a time: the usable ones as summary rows (one
    list per column, strings shared), the left-out and invalid ones listed, and what the
    run metadata needs; no record is kept whole, so memory stays well below the input's size.
    """

    columns: dict[str, list[Any]] = field(
        default_factory=lambda: {name: [] for name in _ROW_COLUMNS})
    skipped: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    distinct: dict[str, _Distinct] = field(
        default_factory=lambda: {key: _Distinct() for key in _METADATA_FIELDS})
    timestamps: list[str] = field(default_factory=list)  # the first and the last
    valid: int = 0
    hbw_emulated: bool = False
    #: digest of (point, *_IDENTITY) -> (file, line) where that record was first read
    _places: dict[bytes, tuple[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        """How many records were averaged in."""
        return len(self.columns["point"])

    @property
    def lines(self) -> int:
        """How many non-empty lines were read, valid or not."""
        return self.valid + len(self.rejected)

    def add(self, path: str, number: int, record: Any, error: str | None) -> None:
        """Sort one line: rejected (with the reason), skipped, or a summary row."""
        where = {"file": path, "line": number}
        if error is None:
            try:
                record = adopt(record)
            except ValueError as refused:
                error = str(refused)
        if error is None:
            problems = validate_record(record)
            error = "; ".join(problems) if problems else None
        if error is None:
            coordinates, key = _point(record)
            identity = json.dumps([key, *(record[name] for name in _IDENTITY)])
            place = hashlib.blake2b(identity.encode(), digest_size=16).digest()
            if first := self._places.get(place):
                error = (f"duplicate of {first[0]}:{first[1]} "
                         f"(same point, {', '.join(_IDENTITY)})")
            else:
                self._places[place] = (path, number)
        if error is not None:
            self.rejected.append({**where, "error": clip(error)})
            return
        self._remember(record)
        reason = _left_out_reason(record)
        if reason is not None:
            status, why = reason
            self.skipped.append({**where, "benchmark": record["benchmark"], "status": status,
                                 "point": key, "reason": why, "run_id": record["run_id"],
                                 "host": record["host"],
                                 "budget_minimum_bytes": record.get("budget_minimum_bytes")})
            return
        for name, value in _flatten(record, coordinates, key).items():
            self.columns[name].append(sys.intern(value) if isinstance(value, str) else value)
        placement = record.get("placement")
        self.hbw_emulated |= isinstance(placement, dict) and bool(placement.get("emulated"))

    def _remember(self, record: dict[str, Any]) -> None:
        self.valid += 1
        for key, name in _METADATA_FIELDS.items():
            self.distinct[key].add(record.get(name))
        stamp = record["timestamp"]
        if not self.timestamps:
            self.timestamps = [stamp, stamp]
        self.timestamps = [min(self.timestamps[0], stamp), max(self.timestamps[1], stamp)]


@dataclass
class AggregateResult:
    """What ``aggregate`` produced: the summary table and the left-out records."""

    summary: pd.DataFrame
    loaded: Loaded
    metadata: dict[str, Any]
    out_dir: Path


def find_inputs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (files, or folders searched recursively).

    Raises ``FileNotFoundError`` naming the first path that does not exist and
    ``PermissionError`` for one that cannot be read.
    """
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"{path}: not readable")
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            found.setdefault(file.resolve(), None)
    return list(found)


def _point(record: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The record's coordinates and its point key (a VM point's own)."""
    spec = BENCHMARKS[record["benchmark"]]
    coordinates = spec.coordinates_of(record)
    return coordinates, point_key(spec.point_key(coordinates), vm_name(record))


def load_records(files: Iterable[Path]) -> Loaded:
    """Read and validate every record of ``files``, one line at a time; sort them into
    summary rows, skipped and rejected (not JSON, not UTF-8, non-finite numbers, schema
    violations, duplicates)."""
    loaded = Loaded()
    for path in files:
        name = str(path)
        loaded.files.append(name)
        for number, record, error in read_lines(path):
            loaded.add(name, number, record, error)
    return loaded


def _left_out_reason(record: dict[str, Any]) -> tuple[str, str] | None:
    """``(status, reason)`` when a valid record must not be averaged in, else None."""
    if record["status"] != "ok":
        return record["status"], record["reason"]
    why = BENCHMARKS[record["benchmark"]].sanity(record)
    return None if why is None else ("failed", why)


def _flatten(record: dict[str, Any], coordinates: dict[str, Any], key: str
             ) -> dict[str, Any]:
    """One ok record as a flat row: coordinates, point key and metric values."""
    row = dict.fromkeys(_ROW_COLUMNS)
    row.update(benchmark=record["benchmark"], point=key, **coordinates)
    for metric in BENCHMARKS[record["benchmark"]].metrics:
        row[metric.name] = metric.of(record)
    placement = record.get("placement")
    row["emulated"] = placement.get("emulated") if isinstance(placement, dict) else None
    row["run_id"] = record["run_id"]
    row["host"] = record["host"]
    row["system"] = record.get("system")
    row["samples"] = record_samples(BENCHMARKS[record["benchmark"]], record)
    node = record.get("node") or {}
    row["shared_cores"] = node.get("shared_cores")
    row["other_busy_cpus"] = node.get("other_busy_cpus")
    row[VM_COLUMN] = vm_name(record)
    return row


def _any_shared(values: pd.Series) -> Any:
    """True when any record of a point shared cores, False when none did, NA when unknown."""
    known = values.dropna()
    return bool(known.astype(bool).any()) if len(known) else None


def _joined(values: Iterable[Any]) -> str:
    return ",".join(sorted({str(v) for v in values if v is not None}))


def summarize(loaded: Loaded) -> pd.DataFrame:
    """One row per point: medians over repeats of every metric, with repeat count and runs."""
    import pandas as pd

    rows = pd.DataFrame(loaded.columns, columns=_ROW_COLUMNS)
    rows[METRICS] = rows[METRICS].apply(pd.to_numeric, errors="coerce")
    groups = rows.groupby("point", sort=False)
    summary = groups[["benchmark", *COORDINATES]].first()
    summary["emulated"] = groups["emulated"].agg(lambda s: bool(s.fillna(False).astype(bool).any()))
    summary[METRICS] = groups[METRICS].median()
    summary["repeats"] = groups.size()
    summary["run_ids"] = groups["run_id"].agg(_joined)
    summary["hosts"] = groups["host"].agg(_joined)
    summary["systems"] = groups["system"].agg(_joined)
    summary["samples"] = groups["samples"].agg(merge_samples)
    summary["shared_cores"] = groups["shared_cores"].agg(_any_shared).astype("boolean")
    summary["other_busy_cpus"] = pd.to_numeric(groups["other_busy_cpus"].max(), errors="coerce")
    summary[VM_COLUMN] = groups[VM_COLUMN].first()
    summary = summary.reset_index()[SUMMARY_COLUMNS]
    for name, reporting in REPORTS.items():
        ours = summary["benchmark"] == name
        if reporting.derive is not None and ours.any():
            derived = reporting.derive(summary[ours])
            summary.loc[ours, list(derived.columns)] = derived
    summary[INTEGER_COLUMNS] = summary[INTEGER_COLUMNS].astype("Int64")
    order = ["benchmark", *COORDINATES]
    return summary.sort_values(order, kind="stable", na_position="last").reset_index(drop=True)


def run_metadata(loaded: Loaded) -> dict[str, Any]:
    """Run metadata over every valid record: runs, hosts, versions, container, Slurm jobs."""
    first, last = loaded.timestamps or [None, None]
    return {
        **{key: distinct.values for key, distinct in loaded.distinct.items()},
        "hbw_emulated": loaded.hbw_emulated,
        "first_timestamp": first,
        "last_timestamp": last,
        "records": {
            "ok": loaded.ok,
            "failed": sum(s["status"] == "failed" for s in loaded.skipped),
            "skipped": sum(s["status"] == "skipped" for s in loaded.skipped),
            "rejected": len(loaded.rejected),
        },
        "inputs": loaded.files,
        "aggregated_at": utc_now(),
    }


def write_outputs(out_dir: Path, summary: pd.DataFrame, loaded: Loaded,
                  metadata: dict[str, Any]) -> None:
    """Write every output file into ``out_dir``.

    All contents are rendered in memory first, so a conversion error writes
    nothing; then every file is written under a temporary name, and only when all are
    written are they renamed into place: a failure (a full disk) leaves the folder as it was.
    """
    import io
    from contextlib import ExitStack

    import pandas as pd

    parquet = io.BytesIO()
    summary.to_parquet(parquet, index=False)
    tables = {
        "rejected.csv": pd.DataFrame(loaded.rejected, columns=REJECTED_COLUMNS),
        "skipped.csv": pd.DataFrame(loaded.skipped, columns=SKIPPED_COLUMNS),
    }
    real, _ = split(summary)
    for name, reporting in REPORTS.items():
        points = benchmark_points(real, name)
        tables.update({file: make(points) for file, make in reporting.tables.items()})
    tables["summary.csv"] = summary
    contents = {name: frame.to_csv(index=False).encode() for name, frame in tables.items()}
    contents["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    contents["summary.parquet"] = parquet.getvalue()
    with write_errors(out_dir), ExitStack() as stack:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in contents.items():
            stack.enter_context(atomic_open(out_dir / name, "wb")).write(data)


def aggregate(inputs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]
              ) -> AggregateResult:
    """Validate, summarize and write the records found under ``inputs`` into ``out_dir``.

    Raises ``ValueError`` when the inputs hold no record line at all and
    :class:`hpcmem.outputs.OutputPathError` when ``out_dir`` cannot be written (checked first).
    """
    out = check_output_dir(out_dir)
    files = find_inputs(inputs)
    loaded = load_records(files)
    if loaded.lines == 0:
        names = ", ".join(map(str, inputs))
        raise ValueError(f"no records found in {names} (looked for non-empty *.jsonl lines)")
    summary = summarize(loaded)
    metadata = run_metadata(loaded)
    write_outputs(out, summary, loaded, metadata)
    return AggregateResult(summary=summary, loaded=loaded, metadata=metadata, out_dir=out)


