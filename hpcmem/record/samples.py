"""A point's samples: one value per independent repeat, and how far apart they lie.

A record with ``repeats`` (collectives) holds each repeat's figures in the record's own
shape, so a metric reads the same from a repeat as from the record; a record without
(training, records made before repeats existed) is one sample. The summary keeps every
point's samples (``samples``, JSON: metric -> values); the check's rank test compares them
with the history's, and the report draws their range.

The spread of a point is ``(max - min) / median`` of its samples: above
:data:`NOISY_SPREAD` the repeats disagree too much for the point to be judged on its own.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from hpcmem.record.spec import Benchmark

__all__ = ["NOISY_SPREAD", "merge_samples", "read_samples", "record_samples", "spread"]

#: the spread above which a point's repeats disagree too much to judge it
NOISY_SPREAD = 0.5


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def record_samples(spec: Benchmark, record: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per metric of ``spec``, the values of the record's repeats (or its own value)."""
    repeats = record.get("repeats") or [record]
    samples = {}
    for metric in spec.metrics:
        values = [float(v) for v in map(metric.of, repeats) if _number(v)]
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


def read_samples(text: Any) -> dict[str, list[float]]:
    """The summary's ``samples`` cell as a mapping (empty for a missing cell)."""
    if not isinstance(text, str) or not text:
        return {}
    return json.loads(text)


def spread(values: Iterable[float]) -> float | None:
    """``(max - min) / median`` of ``values``; None for fewer than two or a median of 0."""
    values = list(values)
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / abs(middle) if middle else None
