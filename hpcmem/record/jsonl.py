"""JSONL records on disk: written atomically, read line by line with every bad line named.

A file is written under a temporary name in its own folder and renamed into place when
complete, so a killed job never leaves a half-written file that looks valid. Reading
takes bytes one line at a time: a line that is not UTF-8, not JSON or holds a non-finite
number is reported with its line number, never guessed at.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from hpcmem.errors import HpcmemError, clip

__all__ = ["atomic_open", "parse_line", "read_lines", "read_records", "write_records"]


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


class _NonFiniteError(HpcmemError, ValueError):
    """A JSON number that is not finite (NaN, Infinity, 1e999): no measurement is."""


def _refuse_constant(name: str) -> float:
    raise _NonFiniteError(f"non-finite number {name} is not accepted")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFiniteError(f"non-finite number {clip(text, 40)} is not accepted")
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
    except _NonFiniteError as error:
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
