"""Values from outside checked before use: one vocabulary for options, config fields,
environment variables, files and what other tools print.

Each check returns the value in the form the caller uses, or raises a
:class:`~hpcmem.errors.BadInputError` (exit status 2) whose message is one line: the
field (an option, a config key, an environment variable, a tool and what it printed),
the value as given (clipped to :data:`VALUE_LIMIT` characters), and what is accepted::

    HPCMEM_RUN_ID: '../../escape' is not a run id (accepted: 1 to 64 letters, ...)

====================  ================================================================
:func:`whole_number`  an integer within bounds, written in ASCII digits
:func:`finite_number` a finite number (no NaN, no infinity), optionally within bounds
:func:`matching`      text that must match a pattern: a name, a field a tool printed
:func:`inside`        a relative path that stays inside its root folder
:func:`decode_text`   bytes that must be UTF-8 text: a file's, or a tool's output
:func:`read_yaml`     a YAML file, aliases refused at once (no alias bomb expands)
:func:`yaml_mapping`  a YAML file whose document is a mapping (``key: value`` lines)
====================  ================================================================

:func:`decode_text` and :func:`read_yaml` are :mod:`hpcmem.textfiles`' (their errors are
its :class:`~hpcmem.textfiles.TextFileError`); sizes and counts with units are
:mod:`hpcmem.units`, paths to write :mod:`hpcmem.outputs`. :func:`refused` builds the
same one-line error for a check of the caller's own.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path, PurePath
from typing import Any

from hpcmem.errors import BadInputError, clip
from hpcmem.textfiles import TextFileError, decode_text, read_yaml

__all__ = [
    "VALUE_LIMIT",
    "InputError",
    "decode_text",
    "finite_number",
    "inside",
    "matching",
    "read_yaml",
    "refused",
    "whole_number",
    "yaml_mapping",
]

#: the most characters of a refused value its message shows, so that what is accepted,
#: after it, is not clipped off the line (:data:`~hpcmem.errors.MESSAGE_LIMIT`)
VALUE_LIMIT = 100
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_YAML_KINDS = {type(None): "nothing", list: "a YAML list", str: "a YAML string",
               int: "a YAML number", float: "a YAML number", bool: "a YAML boolean"}


class InputError(BadInputError):
    """A value that is not what its field accepts; the message names both."""


def refused(field: str, value: object, problem: str, accepted: str) -> InputError:
    """The error for ``value`` of ``field``: ``FIELD: VALUE PROBLEM (accepted: ACCEPTED)``.

    >>> print(refused("--ranks", "²", "is not a whole number", "1 to 64"))
    --ranks: '²' is not a whole number (accepted: 1 to 64)
    """
    return InputError(f"{field}: {clip(repr(value), VALUE_LIMIT)} {problem} "
                      f"(accepted: {accepted})")


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" of at least {minimum}"
    return f" of at most {maximum}" if maximum is not None else ""


def whole_number(value: str | int, field: str, *, minimum: int, maximum: int) -> int:
    """``value`` (an int, or its ASCII digits with an optional sign) as an int within
    ``minimum..maximum``; Unicode digits (``٣``, ``²``), ``1_000``, ``1.0`` and numbers
    too long to convert are refused.

    >>> whole_number(" 42 ", "--ranks", minimum=1, maximum=64)
    42
    """
    accepted = f"a whole number{_bounds(minimum, maximum)}, in ASCII digits"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise refused(field, value, "is not a whole number", accepted)
    if isinstance(value, str):
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            raise refused(field, value, "is not a whole number", accepted)
        widest = len(str(max(abs(minimum), abs(maximum))))
        if len(text.lstrip("+-").lstrip("0")) > widest:  # (int() refuses 4300+ digits)
            raise refused(field, value, "is out of range", accepted)
    number = int(text) if isinstance(value, str) else value
    if not minimum <= number <= maximum:
        raise refused(field, value, "is out of range", accepted)
    return number


def finite_number(value: str | float, field: str, *, minimum: float | None = None,
                  maximum: float | None = None) -> float:
    """``value`` (a number, or its ASCII decimal text: ``1.5``, ``-2e3``) as a finite float
    within the bounds given; NaN, infinities and overflowing text (``1e999``) are refused.

    >>> finite_number("2.5e3", "threshold", minimum=0)
    2500.0
    """
    accepted = f"a finite number{_bounds(minimum, maximum)}, in ASCII digits"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise refused(field, value, "is not a number", accepted)
    if isinstance(value, str) and not _DECIMAL.fullmatch(value.strip()):
        raise refused(field, value, "is not a number", accepted)
    try:
        number = float(value)
    except OverflowError:  # an int beyond the floats
        number = math.inf
    if not math.isfinite(number):
        raise refused(field, value, "is not finite", accepted)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise refused(field, value, "is out of range", accepted)
    return number


def matching(text: object, pattern: str | re.Pattern[str], field: str, *, what: str,
             accepted: str) -> re.Match[str]:
    """The match of all of ``text`` by ``pattern``; else the error says ``text`` is not
    ``what`` (a noun: ``"a run id"``) and what is ``accepted``.

    >>> matching("02:30:00", r"([0-9]+):([0-9]+):([0-9]+)", "MaxTime", what="a time",
    ...          accepted="hours:minutes:seconds").groups()
    ('02', '30', '00')
    """
    found = re.fullmatch(pattern, text) if isinstance(text, str) else None
    if found is None:
        raise refused(field, text, f"is not {what}", accepted)
    return found


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str], field: str, *,
           links_may_leave: bool = False) -> Path:
    """``root / path`` for a relative ``path`` without ``..`` that stays inside ``root``,
    also through symbolic links unless ``links_may_leave`` (a link there that leads
    elsewhere on purpose, as a shared store). Paths need not exist yet.

    >>> inside("results/run1", "/work", "output_dir")
    PosixPath('/work/results/run1')
    """
    text = os.fspath(path)
    accepted = (f"a relative path inside {root}, without '..'"
                + ("" if links_may_leave else ", through no symbolic link out of it"))
    if not text or "\0" in text:
        raise refused(field, text, "is not a path", accepted)
    relative = PurePath(text)
    if relative.is_absolute():
        raise refused(field, text, "is an absolute path", accepted)
    if ".." in relative.parts:
        raise refused(field, text, f"leaves {root} ('..')", accepted)
    target = Path(root, relative)
    if not links_may_leave:
        resolved = target.resolve()
        if not resolved.is_relative_to(Path(root).resolve()):
            raise refused(field, text, f"leads out of {root} (a symbolic link to {resolved})",
                          accepted)
    return target


def yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML mapping in the file ``path`` (read with :func:`read_yaml`); TextFileError
    names the file when it holds anything else (a list, a string, nothing)."""
    document = read_yaml(path)
    if not isinstance(document, dict):
        kind = _YAML_KINDS.get(type(document), "a YAML value")
        raise TextFileError(f"{path}: holds {kind}, not a mapping of settings (key: value lines)")
    return document
