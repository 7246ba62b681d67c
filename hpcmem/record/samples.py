"""A point's samples: one value per independent repeat, and how far apart they lie.

A record with ``repeats`` (collectives) holds each repeat's figures in the record's own
shape, so a metric reads the same from a repeat as from the record; a record without
(training, records made before repeats existed) is one sample. The summary keeps every
point's samples (``samples``, JSON: metric -> values); the check's rank test compares them
with the history's, and the report draws their range.

The spread of a point is ``(max - min) / median`` of its samples: above
:data:`NOISY_SPREAD` the repeats disagree too much for the point to be judged on its own.
Samples read back (:func:`read_samples`, :func:`read_values`) must be JSON of finite
numbers; anything else raises :class:`SamplesError`, showing the text.
"""

from __future__ import annotations

import json
import math
import numbers
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from hpcmem.errors import BadInputError, clip
from hpcmem.record.spec import Benchmark

__all__ = ["NOISY_SPREAD", "SamplesError", "finite_number", "merge_samples", "read_samples",
           "read_values", "record_samples", "spread"]

#: the spread above which a point's repeats disagree too much to judge it
NOISY_SPREAD = 0.5
#: characters of bad samples text an error shows: room is left for where it was and why
_SHOWN = 60


class SamplesError(BadInputError, ValueError):
    """Samples text that is not JSON of finite numbers; the message shows the text and why."""


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number (Python's or NumPy's), not a boolean; an
    integer too large for a float is not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def record_samples(spec: Benchmark, record: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per metric of ``spec``, the values of the record's repeats (or its own value)."""
    repeats = record.get("repeats") or [record]
    samples = {}
    for metric in spec.metrics:
        values = [float(v) for v in map(metric.of, repeats) if finite_number(v)]
        if values:
            samples[metric.name] = values
    return samples


def merge_samples(per_record: Iterable[Mapping[str, list[float]]]) -> str:
    """The samples of several records of one point, as the summary's JSON text."""
    merged: dict[str, list[float]] = {}
    for samples in per_record:
        for name, values in samples.items():
            merged.setdefault(name, []).extend(values)
    return json.dumps(merged, sort_keys=True)


def _json(text: Any) -> Any:
    """The JSON value in ``text``; SamplesError shows the text and where it stops being JSON."""
    if not isinstance(text, str):
        raise SamplesError(f"{clip(repr(text), _SHOWN)} is not JSON text")
    try:
        return json.loads(text)
    except ValueError as error:  # JSONDecodeError, or a number too long to convert
        why = clip(str(error), _SHOWN)
        raise SamplesError(f"{clip(repr(text), _SHOWN)} is not JSON ({why})") from None


def _numbers(values: Any) -> bool:
    return isinstance(values, list) and all(map(finite_number, values))


def read_values(text: Any) -> list[float]:
    """One figure's samples as the history stores them: a JSON list of finite numbers."""
    values = _json(text)
    if not _numbers(values):
        raise SamplesError(f"{clip(repr(text), _SHOWN)} is not a JSON list of finite numbers")
    return [float(value) for value in values]


def read_samples(text: Any) -> dict[str, list[float]]:
    """The summary's ``samples`` cell as a mapping of metric -> values (empty for a missing
    cell); SamplesError when it is not a JSON object of lists of finite numbers."""
    if not isinstance(text, str) or not text:
        return {}
    samples = _json(text)
    if not isinstance(samples, dict) or not all(map(_numbers, samples.values())):
        raise SamplesError(f"{clip(repr(text), _SHOWN)} is not a JSON object of metric -> "
                           "list of finite numbers")
    return {name: [float(value) for value in values] for name, values in samples.items()}


def spread(values: Iterable[float]) -> float | None:
    """``(max - min) / median`` of ``values``; None for fewer than two or a median of 0."""
    values = list(values)
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / abs(middle) if middle else None
