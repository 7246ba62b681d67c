"""Aggregate result records into one row per sweep point (pandas).

Every record is validated against the record schema first. Valid ``ok`` records
are grouped by point — the benchmark and its sweep coordinates — and reduced to
medians over repeats. Invalid lines (not JSON, or schema violations) go to
``rejected.csv`` with ``file:line`` and the message; ``failed`` and ``skipped``
records (and ``ok`` collectives whose result was not validated) go to
``skipped.csv`` with their reason. Neither is ever averaged in.

Outputs in the ``--out`` folder, each written atomically (temp name + rename):

``summary.parquet`` / ``summary.csv``
    one row per point, medians over repeats, ``point`` is its key
``collectives_latency.csv``
    median average latency (µs): rows op, dtype, ranks, binding, size; one column per buffer kind
``collectives_speedup.csv``
    per op and size, each buffer kind's speedup over ``numpy`` buffers (numpy latency / latency)
``train_step_time.csv``
    median step time per policy and its ratio to the ``um`` and ``cuda`` presets
``rejected.csv``, ``skipped.csv``, ``metadata.json``
    the records left out, with reasons, and the run metadata
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.results.records import atomic_open, utc_now, validate_record

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLLECTIVES_POINT",
    "TRAIN_POINT",
    "AggregateResult",
    "Loaded",
    "Summary",
    "aggregate",
    "binding_label",
    "find_inputs",
    "load_records",
    "point_key",
    "read_summary",
    "summarize",
    "write_outputs",
]

#: Sweep coordinates that identify one point, per benchmark (in key order).
COLLECTIVES_POINT = ("op", "buffer", "dtype", "ranks", "binding", "size_bytes")
TRAIN_POINT = ("model", "params", "batch", "seq_len", "dtype", "gpu_budget", "policy")
_COORDINATES = list(dict.fromkeys([*COLLECTIVES_POINT, *TRAIN_POINT]))

_COLLECTIVES_METRICS = {
    "latency_us_avg": ("latency_us", "avg"),
    "latency_us_min": ("latency_us", "min"),
    "latency_us_max": ("latency_us", "max"),
    "algbw_GBps": ("algbw_GBps", None),
    "busbw_GBps": ("busbw_GBps", None),
    "hbw_fraction": ("placement", "hbw_fraction"),
}
_TRAIN_METRICS = {
    "step_ms_median": ("step_ms", "median"),
    "step_ms_p10": ("step_ms", "p10"),
    "step_ms_p90": ("step_ms", "p90"),
    "first_step_ms": ("first_step_ms", None),
    "throughput": ("throughput", None),
    "oversubscription": ("oversubscription", None),
}
_METRICS = {"collectives": _COLLECTIVES_METRICS, "train": _TRAIN_METRICS}
_METRIC_NAMES = [*_COLLECTIVES_METRICS, *_TRAIN_METRICS]
_INTEGER_COLUMNS = ["ranks", "size_bytes", "params", "batch", "seq_len", "gpu_budget", "repeats"]
_SUMMARY_COLUMNS = [
    "point", "benchmark", *_COORDINATES,
    "emulated", *_METRIC_NAMES, "repeats", "run_ids", "hosts", "systems",
]
_SKIPPED_COLUMNS = ["file", "line", "benchmark", "status", "point", "reason", "run_id", "host"]
_REJECTED_COLUMNS = ["file", "line", "error"]


@dataclass
class Loaded:
    """Records read from the inputs, sorted into usable, left-out and invalid."""

    ok: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    valid: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def lines(self) -> int:
        """How many non-empty lines were read, valid or not."""
        return len(self.valid) + len(self.rejected)


@dataclass
class AggregateResult:
    """What ``aggregate`` produced: the summary table and the left-out records."""

    summary: pd.DataFrame
    loaded: Loaded
    metadata: dict[str, Any]
    out_dir: Path


@dataclass
class Summary:
    """An aggregate output folder read back: the summary and what was left out."""

    points: pd.DataFrame
    skipped: pd.DataFrame
    rejected: pd.DataFrame
    metadata: dict[str, Any]
    folder: Path


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


def binding_label(binding: Any) -> str:
    """A short, stable name for a record's binding: its ``name``, else rank 0's numactl
    arguments, else ``none`` (no wrapper reported any)."""
    if not isinstance(binding, dict):
        return "none"
    if isinstance(binding.get("name"), str) and binding["name"]:
        return binding["name"]
    numactl = binding.get("numactl")
    if isinstance(numactl, list):
        return " ".join(map(str, numactl)) or "none"
    if isinstance(numactl, str):
        return numactl or "none"
    return "none"


def _coordinates(record: dict[str, Any]) -> dict[str, Any]:
    """The sweep coordinates of a record (missing ones are None)."""
    benchmark = record.get("benchmark")
    if benchmark == "collectives":
        coords = {name: record.get(name) for name in COLLECTIVES_POINT}
        coords["binding"] = binding_label(record.get("binding"))
        return coords
    if benchmark == "train":
        coords = {name: record.get(name) for name in TRAIN_POINT}
        # the size asked for is the sweep coordinate; ok records also carry the exact count
        coords["params"] = record.get("params_requested") or record.get("params")
        policy = record.get("policy")
        coords["policy"] = policy.get("name") if isinstance(policy, dict) else policy
        budget = record.get("gpu_budget")
        if budget is None and isinstance(policy, dict):
            budget = policy.get("gpu_budget")
        coords["gpu_budget"] = budget
        return coords
    return {}


def point_key(benchmark: str, coords: dict[str, Any]) -> str:
    """The point's key, the prefix of every figure name ``hpcmem check`` uses.

    ``collectives/<op>/<buffer>/<dtype>/ranks=<n>/binding=<name>/size=<bytes>`` and
    ``train/<model>/params=<n>/batch=<n>/seq=<n>/<dtype>/budget=<bytes|none>/policy=<name>``.
    A coordinate a (skipped) record lacks is written ``?``.
    """

    def show(value: Any) -> str:
        return "?" if value is None else str(value)

    c = coords
    if benchmark == "collectives":
        return (
            f"collectives/{show(c['op'])}/{show(c['buffer'])}/{show(c['dtype'])}"
            f"/ranks={show(c['ranks'])}"
            f"/binding={show(c['binding'])}/size={show(c['size_bytes'])}"
        )
    budget = "none" if c["gpu_budget"] is None else str(c["gpu_budget"])
    return (
        f"train/{show(c['model'])}/params={show(c['params'])}/batch={show(c['batch'])}"
        f"/seq={'none' if c['seq_len'] is None else c['seq_len']}/{show(c['dtype'])}"
        f"/budget={budget}/policy={show(c['policy'])}"
    )


def _line_records(path: Path) -> Iterable[tuple[int, Any, str | None]]:
    """``(line number, parsed JSON or None, error or None)`` for each non-empty line."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line), None
            except json.JSONDecodeError as error:
                yield number, None, f"not a JSON record ({error.msg}; column {error.colno})"


def load_records(files: Iterable[Path]) -> Loaded:
    """Read and validate every record of ``files``; sort them into ok, skipped and rejected."""
    loaded = Loaded()
    for path in files:
        loaded.files.append(str(path))
        for number, record, error in _line_records(path):
            where = {"file": str(path), "line": number}
            if error is None:
                problems = validate_record(record)
                error = "; ".join(problems) if problems else None
            if error is not None:
                loaded.rejected.append({**where, "error": error})
                continue
            loaded.valid.append(record)
            reason = _left_out_reason(record)
            if reason is None:
                loaded.ok.append(record)
            else:
                status, why = reason
                coords = _coordinates(record)
                loaded.skipped.append(
                    {
                        **where,
                        "benchmark": record["benchmark"],
                        "status": status,
                        "point": point_key(record["benchmark"], coords),
                        "reason": why,
                        "run_id": record["run_id"],
                        "host": record["host"],
                    }
                )
    return loaded


def _left_out_reason(record: dict[str, Any]) -> tuple[str, str] | None:
    """``(status, reason)`` when a valid record must not be averaged in, else None."""
    if record["status"] != "ok":
        return record["status"], record["reason"]
    if record["benchmark"] == "collectives" and not record["validated"]:
        return "failed", "status ok but validated is false: the result was not checked correct"
    return None


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    """One ok record as a flat row: coordinates, point key and metric values."""
    benchmark = record["benchmark"]
    coords = _coordinates(record)
    row = {"benchmark": benchmark, "point": point_key(benchmark, coords), **coords}
    for column, (outer, inner) in _METRICS[benchmark].items():
        value = record.get(outer)
        row[column] = value.get(inner) if inner and isinstance(value, dict) else value
    placement = record.get("placement")
    row["emulated"] = placement.get("emulated") if isinstance(placement, dict) else None
    row["run_id"] = record["run_id"]
    row["host"] = record["host"]
    row["system"] = record.get("system")
    return row


def _joined(values: Iterable[Any]) -> str:
    return ",".join(sorted({str(v) for v in values if v is not None}))


def summarize(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per point: medians over repeats of every metric, with repeat count and runs."""
    import pandas as pd

    rows = pd.DataFrame(
        [_flatten(r) for r in records],
        columns=["point", "benchmark", *_COORDINATES, "emulated", *_METRIC_NAMES, "run_id", "host",
                 "system"],
    )
    rows[_METRIC_NAMES] = rows[_METRIC_NAMES].apply(pd.to_numeric, errors="coerce")
    groups = rows.groupby("point", sort=False)
    summary = groups[["benchmark", *_COORDINATES]].first()
    summary["emulated"] = groups["emulated"].agg(lambda s: bool(s.fillna(False).astype(bool).any()))
    summary[_METRIC_NAMES] = groups[_METRIC_NAMES].median()
    summary["repeats"] = groups.size()
    summary["run_ids"] = groups["run_id"].agg(_joined)
    summary["hosts"] = groups["host"].agg(_joined)
    summary["systems"] = groups["system"].agg(_joined)
    summary = summary.reset_index()[_SUMMARY_COLUMNS]
    summary[_INTEGER_COLUMNS] = summary[_INTEGER_COLUMNS].astype("Int64")
    order = ["benchmark", "op", "model", "params", "buffer", "ranks", "binding", "size_bytes"]
    return summary.sort_values(order, kind="stable", na_position="last").reset_index(drop=True)


def latency_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Median average latency (µs) by op, dtype, ranks, binding and size; a column per buffer."""
    import pandas as pd

    coll = summary[summary["benchmark"] == "collectives"]
    index = ["op", "dtype", "ranks", "binding", "size_bytes"]
    if coll.empty:
        return pd.DataFrame(columns=index)
    table = coll.pivot_table(
        index=index, columns="buffer", values="latency_us_avg", aggfunc="first", dropna=False
    )
    table.columns.name = None
    return table.add_prefix("latency_us_").reset_index()


def speedup_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per op and size, each non-numpy buffer's speedup over numpy (numpy latency / its latency)."""
    import pandas as pd

    columns = ["op", "dtype", "ranks", "binding", "size_bytes", "buffer", "latency_us",
               "numpy_latency_us", "speedup"]
    coll = summary[summary["benchmark"] == "collectives"]
    base = coll[coll["buffer"] == "numpy"]
    other = coll[coll["buffer"] != "numpy"]
    if base.empty or other.empty:
        return pd.DataFrame(columns=columns)
    keys = ["op", "dtype", "ranks", "binding", "size_bytes"]
    merged = other[[*keys, "buffer", "latency_us_avg"]].merge(
        base[[*keys, "latency_us_avg"]], on=keys, suffixes=("", "_numpy")
    )
    merged = merged.rename(
        columns={"latency_us_avg": "latency_us", "latency_us_avg_numpy": "numpy_latency_us"}
    )
    merged["speedup"] = merged["numpy_latency_us"] / merged["latency_us"]
    return merged[columns].sort_values([*keys[:4], "buffer", "size_bytes"]).reset_index(drop=True)


def step_time_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Median step time per policy and its ratio to the ``um`` and ``cuda`` presets."""
    keys = [c for c in TRAIN_POINT if c != "policy"]
    columns = [*keys, "policy", "step_ms_median", "step_ms_p10", "step_ms_p90",
               "first_step_ms", "repeats"]
    train = summary.loc[summary["benchmark"] == "train", columns].copy()
    for preset in ("um", "cuda"):
        ref = train.loc[train["policy"] == preset, [*keys, "step_ms_median"]]
        ref = ref.rename(columns={"step_ms_median": f"_{preset}"})
        train = train.merge(ref, on=keys, how="left")
        train[f"ratio_to_{preset}"] = train["step_ms_median"] / train[f"_{preset}"]
        train = train.drop(columns=f"_{preset}")
    return train.reset_index(drop=True)


def run_metadata(loaded: Loaded) -> dict[str, Any]:
    """Run metadata over every valid record: runs, hosts, versions, container, Slurm jobs."""

    def unique(name: str, inner: str | None = None) -> list[Any]:
        seen: list[Any] = []
        for record in loaded.valid:
            value = record.get(name)
            if inner is not None:
                value = value.get(inner) if isinstance(value, dict) else None
            if value is not None and value not in seen:
                seen.append(value)
        return seen

    stamps = sorted(r["timestamp"] for r in loaded.valid)
    return {
        "run_ids": unique("run_id"),
        "hosts": unique("host"),
        "git_shas": unique("git_sha"),
        "hpcmem_versions": unique("hpcmem_version"),
        "containers": unique("container"),
        "slurm_job_ids": unique("slurm_job_id"),
        "systems": unique("system"),
        "mpi_libraries": unique("mpi_library"),
        "gpus": unique("gpu"),
        "torch": unique("torch"),
        "cuda": unique("cuda"),
        "hbw_emulated": any(
            isinstance(r.get("placement"), dict) and r["placement"].get("emulated")
            for r in loaded.ok
        ),
        "first_timestamp": stamps[0] if stamps else None,
        "last_timestamp": stamps[-1] if stamps else None,
        "records": {
            "ok": len(loaded.ok),
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
    nothing; then each file is written under a temporary name and renamed.
    """
    import io

    import pandas as pd

    parquet = io.BytesIO()
    summary.to_parquet(parquet, index=False)
    tables = {
        "rejected.csv": pd.DataFrame(loaded.rejected, columns=_REJECTED_COLUMNS),
        "skipped.csv": pd.DataFrame(loaded.skipped, columns=_SKIPPED_COLUMNS),
        "collectives_latency.csv": latency_table(summary),
        "collectives_speedup.csv": speedup_table(summary),
        "train_step_time.csv": step_time_table(summary),
        "summary.csv": summary,
    }
    contents = {name: frame.to_csv(index=False).encode() for name, frame in tables.items()}
    contents["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    contents["summary.parquet"] = parquet.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        with atomic_open(out_dir / name, "wb") as handle:
            handle.write(data)


def aggregate(inputs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]
              ) -> AggregateResult:
    """Validate, summarize and write the records found under ``inputs`` into ``out_dir``.

    Raises ``ValueError`` when the inputs hold no record line at all.
    """
    files = find_inputs(inputs)
    loaded = load_records(files)
    if loaded.lines == 0:
        names = ", ".join(map(str, inputs))
        raise ValueError(f"no records found in {names} (looked for non-empty *.jsonl lines)")
    summary = summarize(loaded.ok)
    metadata = run_metadata(loaded)
    out = Path(out_dir)
    write_outputs(out, summary, loaded, metadata)
    return AggregateResult(summary=summary, loaded=loaded, metadata=metadata, out_dir=out)


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
    missing = set(_SUMMARY_COLUMNS) - set(parts["summary.parquet"].columns)
    if missing:
        names = ", ".join(sorted(missing))
        raise ValueError(f"{folder / 'summary.parquet'}: missing columns {names}")
    return Summary(
        points=parts["summary.parquet"],
        skipped=parts["skipped.csv"],
        rejected=parts["rejected.csv"],
        metadata=parts["metadata.json"],
        folder=folder,
    )
