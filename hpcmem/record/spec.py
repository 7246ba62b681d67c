"""What a benchmark declares once, next to the code that produces its records.

A :class:`Benchmark` names the coordinates of a point (its sweep axes, which make the
point key), the :class:`Metric` figures it measures (unit, which direction is better,
whether every run checks it) and the other fields its ``ok`` records carry (a JSON
Schema fragment). A spec imports nothing of the results pipeline: a measuring rank loads
only its own. The pipeline reads the specs from :mod:`hpcmem.results.registry`: the record
schema, the summary's columns (``aggregate``), the figures references may name
(``references``) and the verdict (``check``) follow from them; the report's sections come
from each benchmark's :class:`hpcmem.draw.reporting.Reporting`.

A metric's name is its path in a record (``latency_us.avg`` is ``record["latency_us"]["avg"]``),
its summary column and the last part of its figure key: one spelling from record to report.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HIGHER", "LOWER", "NONNEGATIVE", "Benchmark", "Coordinate", "Metric"]

LOWER = "lower"
HIGHER = "higher"
#: the record schema of a metric unless it says otherwise
NONNEGATIVE: Mapping[str, Any] = {"type": "number", "minimum": 0}

Record = Mapping[str, Any]


def _always(_point: Record) -> bool:
    return True


def _sane(_record: Record) -> str | None:
    return None


@dataclass(frozen=True)
class Coordinate:
    """One sweep axis: a record field, a summary column and one part of the point key."""

    name: str
    label: str | None = None  # the key part is ``label=value``; None: the bare value
    missing: str = "?"  # written in the key for a value the record lacks
    integer: bool = False  # a column of whole numbers in the summary
    read: Callable[[Record], Any] | None = None  # default: ``record.get(name)``
    #: a value the key leaves out (an axis added later keeps the keys of earlier points)
    implied: Any = None

    def of(self, record: Record) -> Any:
        """This coordinate's value in ``record`` (None when it lacks it)."""
        return self.read(record) if self.read is not None else record.get(self.name)

    def key_part(self, value: Any) -> str:
        """The part of the point key for ``value`` ("" for the implied value)."""
        if self.implied is not None and value == self.implied:
            return ""
        text = self.missing if value is None else str(value)
        return text if self.label is None else f"{self.label}={text}"


@dataclass(frozen=True)
class Metric:
    """One measured figure of a point."""

    name: str  # path in the record, summary column, last part of the figure key
    unit: str
    better: str | None  # LOWER, HIGHER, or None for a measured property with no direction
    checked: bool = False  # every run checks it; otherwise only when a reference names it
    applies: Callable[[Record], bool] = _always  # does a summary point have this figure?
    required: bool = True  # must every ok record carry it (False: only some runs measure it)
    schema: Mapping[str, Any] = field(default_factory=lambda: dict(NONNEGATIVE))

    def of(self, record: Record) -> Any:
        """The value at this metric's path in ``record`` (None when absent)."""
        value: Any = record
        for part in self.name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's records, as the results pipeline reads them."""

    name: str
    coordinates: tuple[Coordinate, ...]
    metrics: tuple[Metric, ...]
    #: JSON Schema (``required`` and ``properties``) of an ok record's other fields
    fields: Mapping[str, Any]
    #: run-metadata key -> the record field whose distinct values it lists
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: why a valid ok record must still not be averaged in (its result was not checked), or None
    sanity: Callable[[Record], str | None] = _sane

    def coordinates_of(self, record: Record) -> dict[str, Any]:
        """The point's coordinates in ``record``, None where it lacks one."""
        return {c.name: c.of(record) for c in self.coordinates}

    def point_key(self, coordinates: Mapping[str, Any]) -> str:
        """``<benchmark>/<part>/...``, the prefix of every figure of the point."""
        parts = (c.key_part(coordinates.get(c.name)) for c in self.coordinates)
        return "/".join([self.name, *filter(None, parts)])

    def metric(self, name: str) -> Metric | None:
        """The metric called ``name``, or None."""
        return next((m for m in self.metrics if m.name == name), None)

    def ok_schema(self) -> dict[str, Any]:
        """JSON Schema of this benchmark's fields in an ``ok`` record: ``fields`` with every
        metric added at its path (``latency_us.avg`` makes ``latency_us`` an object)."""
        schema = copy.deepcopy(dict(self.fields))
        required, properties = schema.setdefault("required", []), schema.setdefault(
            "properties", {})
        for metric in self.metrics:
            outer, _, inner = metric.name.partition(".")
            if metric.required and outer not in required:
                required.append(outer)
            if not inner:
                properties[outer] = dict(metric.schema)
                continue
            container = properties.setdefault(outer, {"type": "object"})
            container.setdefault("required", []).append(inner)
            container.setdefault("properties", {})[inner] = dict(metric.schema)
        return schema
