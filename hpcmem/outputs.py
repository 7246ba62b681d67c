"""Output paths checked before any work starts, and write failures as one-line errors.

A command calls :func:`check_output_file` or :func:`check_output_dir` for every path it
will write before it measures or computes anything, so an unusable path (a folder where
a file goes, a path under a file, a read-only or full file system, no permission) stops
it at once; :func:`write_errors` turns a failure that still happens while writing (the
disk filled meanwhile) into the same :class:`OutputPathError`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpcmem.errors import BadInputError

__all__ = ["OutputPathError", "check_output_dir", "check_output_file", "write_errors"]


class OutputPathError(BadInputError):
    """A path hpcmem was asked to write cannot be written; the message names it and why."""


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _probe_folder(folder: Path, named: str | os.PathLike[str]) -> None:
    """Write one byte under a unique name in ``folder``, or in the nearest folder above it
    that exists (where the missing ones would be made); nothing stays behind."""
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise OutputPathError(f"{named}: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hpcmem-probe.", dir=existing)
        try:
            os.write(fd, b"\0")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as error:
        raise OutputPathError(f"{named}: cannot write in {existing} ({_reason(error)})") from None


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path when a file can be written there; OutputPathError says why not."""
    target = Path(path)
    if str(path) == "" or target.is_dir():
        raise OutputPathError(f"{path}: is a folder, not a file")
    _probe_folder(target.parent, path)
    return target


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path when it is (or can become) a folder files can be written in."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OutputPathError(f"{path}: is a file, not a folder")
    _probe_folder(target, path)
    return target


@contextmanager
def write_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError inside the block becomes an OutputPathError naming ``path`` and the reason."""
    try:
        yield
    except OSError as error:
        raise OutputPathError(f"{path}: cannot write ({_reason(error)})") from None
