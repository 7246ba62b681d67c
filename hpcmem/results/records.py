"""Result records: the fields every benchmark writes, the record schema, JSONL read and write.

One JSON object per line (docs/design.md describes the record). Files are written under a
temporary name in the same folder and renamed into place when complete, so a
killed job never leaves a half-written file that looks valid. Every record names the
commit it was made from: the checkout's, or ``HPCMEM_GIT_SHA`` where there is no checkout.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO, Any

from hpcmem import __version__
from hpcmem.errors import HpcmemError, clip
from hpcmem.node.probe import current_container

__all__ = [
    "GIT_SHA_ENV",
    "SCHEMA_VERSION",
    "STATUSES",
    "atomic_open",
    "common_fields",
    "git_sha",
    "parse_line",
    "read_lines",
    "read_records",
    "record_schema",
    "utc_now",
    "validate_record",
    "write_records",
]

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "skipped")
#: the commit a record was made from, for a process that runs outside a git checkout
GIT_SHA_ENV = "HPCMEM_GIT_SHA"


@cache
def record_schema() -> dict[str, Any]:
    """The JSON Schema of one result record: the common fields
    (``hpcmem/results/schemas/record.schema.json``) and, for an ``ok`` record, its
    benchmark's own fields as its spec declares them."""
    from hpcmem.results.registry import BENCHMARKS

    text = resources.files("hpcmem.results.schemas").joinpath("record.schema.json").read_text()
    schema = json.loads(text)
    for spec in BENCHMARKS.values():
        ok = {"benchmark": {"const": spec.name}, "status": {"const": "ok"}}
        schema["allOf"].append({"if": {"properties": ok}, "then": spec.ok_schema()})
    return schema


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(record_schema())


def validate_record(record: dict[str, Any]) -> list[str]:
    """Every schema violation of ``record`` as a readable line; empty when valid."""
    validator = _validator()
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<record>'}: {error.message}"
        for error in sorted(validator.iter_errors(record), key=lambda e: list(e.absolute_path))
    ]


@cache
def git_sha(checkout: str | os.PathLike[str] | None = None) -> str | None:
    """``HPCMEM_GIT_SHA`` when set, else the commit of ``checkout`` (default: the one hpcmem
    is imported from), else None (an installed copy, and no commit passed in)."""
    if sha := os.environ.get(GIT_SHA_ENV, "").strip():
        return sha
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=checkout or Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def utc_now() -> str:
    """The current time as UTC ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def slurm_system() -> str | None:
    """``cluster:partition`` of the Slurm job this process runs in, or None outside Slurm."""
    cluster = os.environ.get("SLURM_CLUSTER_NAME")
    partition = os.environ.get("SLURM_JOB_PARTITION")
    return f"{cluster}:{partition.split(',')[0]}" if cluster and partition else None


def common_fields(
    benchmark: str,
    *,
    binding: dict[str, Any],
    status: str = "ok",
    reason: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """The fields every record carries, filled from this process and its environment."""
    from hpcmem.results.registry import BENCHMARKS

    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark {benchmark!r} is not one of {', '.join(BENCHMARKS)}")
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": benchmark,
        "run_id": run_id or os.environ.get("HPCMEM_RUN_ID") or uuid.uuid4().hex[:12],
        "timestamp": utc_now(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "system": slurm_system(),
        "git_sha": git_sha(),
        "hpcmem_version": __version__,
        "container": current_container(),
        "binding": binding,
        "status": status,
        "reason": reason,
    }


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open ``path`` for writing (``"w"`` or ``"wb"``); it appears, complete, only when the
    block succeeds. The file gets the permissions ``open()`` would give it (umask applied)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode {mode!r} is not one of 'w', 'wb'")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes files private
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Write ``records`` as JSONL to ``path`` atomically."""
    with atomic_open(path) as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")


class _NonFinite(HpcmemError, ValueError):
    """A JSON number that is not finite (NaN, Infinity, 1e999): no measurement is."""


def _refuse_constant(name: str) -> float:
    raise _NonFinite(f"non-finite number {name} is not accepted")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(f"non-finite number {clip(text, 40)} is not accepted")
    return value


def parse_line(raw: bytes) -> tuple[Any, str | None]:
    """``(parsed JSON, None)`` for one JSONL line, or ``(None, why it is refused)``: not
    UTF-8, not JSON, or holding a non-finite number."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1})"
    try:
        return json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float), None
    except _NonFinite as error:
        return None, f"not a valid JSON record ({error})"
    except json.JSONDecodeError as error:
        return None, f"not a JSON record ({error.msg}; column {error.colno})"
    except RecursionError:
        return None, "not a JSON record (nested too deeply)"


def read_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any, str | None]]:
    """``(line number, parsed JSON, None)`` for each non-empty line of a JSONL file, read as
    bytes one line at a time, or ``(line number, None, error)`` for a line :func:`parse_line`
    refuses."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            record, error = parse_line(raw)
            yield number, record, error


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of one JSONL file; a line that is not JSON raises ValueError naming it."""
    records = []
    for number, record, error in read_lines(path):
        if error is not None:
            raise ValueError(f"{path}:{number}: {error}")
        records.append(record)
    return records
