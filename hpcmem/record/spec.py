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

The same declaration names a workflow job: its *swept* coordinates (one job per
combination) make the job's folder, the key parts of those coordinates in key order, so a
folder is a prefix-ordered subset of its records' keys; the folder reads back into the
point, and the point gives the producer's command-line options:

>>> from hpcmem.collectives.spec import COLLECTIVES
>>> point = COLLECTIVES.parse_folder("allreduce/dram/ranks=8/nodes=2/binding=cores")
>>> point
{'op': 'allreduce', 'buffer': 'dram', 'ranks': 8, 'nodes': 2, 'binding': 'cores'}
>>> COLLECTIVES.folder({**point, "nodes": 1}), COLLECTIVES.options(point)
('allreduce/dram/ranks=8/binding=cores', ['--op', 'allreduce', '--buffer', 'dram'])
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcmem.errors import HpcmemError

__all__ = ["HIGHER", "LOWER", "NONNEGATIVE", "Benchmark", "Coordinate", "FolderError", "Metric"]

LOWER = "lower"
HIGHER = "higher"
#: the record schema of a metric unless it says otherwise
NONNEGATIVE: Mapping[str, Any] = {"type": "number", "minimum": 0}

Record = Mapping[str, Any]
#: a point of a workflow job: swept coordinate -> value
Point = Mapping[str, Any]

#: a value's text in a folder: a whole number, or a name (op, buffer, binding, model, policy)
_INTEGER, _NAME = "[0-9]+", "[a-z][a-z0-9_]*"


class FolderError(HpcmemError, ValueError):
    """A folder that names no point of its benchmark; the message names it and the accepted form."""


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
    #: an axis of the workflow's sweep: one job per value, a part of the job's folder (the
    #: others are measured or derived inside a job: message size, batch, dtype)
    swept: bool = False
    #: the producer's option taking the value (``--op``); None: the launcher or ``hpcmem
    #: bind`` takes it
    option: str | None = None
    #: the value the producer takes when ``option`` is left out, given the point
    default: Callable[[Point], Any] | None = None
    #: None is a value of the point (no GPU budget), spelt ``missing`` in keys and folders
    nullable: bool = False

    def of(self, record: Record) -> Any:
        """This coordinate's value in ``record`` (None when it lacks it)."""
        return self.read(record) if self.read is not None else record.get(self.name)

    def key_part(self, value: Any) -> str:
        """The part of the point key for ``value`` ("" for the implied value)."""
        if self.implied is not None and value == self.implied:
            return ""
        text = self.missing if value is None else str(value)
        return text if self.label is None else f"{self.label}={text}"

    def part_pattern(self, group: bool) -> str:
        """A regex of :meth:`key_part` (the value a named group when ``group``)."""
        value = _INTEGER if self.integer else _NAME
        if self.nullable:
            value = f"{re.escape(self.missing)}|{value}"
        value = f"(?P<{self.name}>{value})" if group else f"(?:{value})"
        return value if self.label is None else f"{self.label}={value}"

    def part_form(self) -> str:
        """:meth:`key_part` as a message shows the accepted form (``budget=<n|none>``)."""
        value = "<n" if self.integer else f"<{self.name}"
        value += f"|{self.missing}>" if self.nullable else ">"
        return value if self.label is None else f"{self.label}={value}"

    def parse(self, text: str | None) -> Any:
        """The value a folder's ``text`` spells (the implied value when the part is absent)."""
        if text is None:
            return self.implied
        if self.nullable and text == self.missing:
            return None
        return int(text) if self.integer else text

    def arguments(self, point: Point) -> list[str]:
        """``[option, value]`` for the producer, or [] where it takes the value by itself
        (no option, no value, or the value it defaults to)."""
        value = point[self.name]
        if self.option is None or value is None:
            return []
        if self.default is not None and value == self.default(point):
            return []
        return [self.option, str(value)]


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
    #: for a producer that writes records of its own shape (a script outside the package,
    #: without the contract's common fields): such a record as the contract's, or None for a
    #: record that is not one of its; a ValueError names the field it refuses
    adopt: Callable[[Record], Record | None] | None = None

    def coordinates_of(self, record: Record) -> dict[str, Any]:
        """The point's coordinates in ``record``, None where it lacks one."""
        return {c.name: c.of(record) for c in self.coordinates}

    def point_key(self, coordinates: Mapping[str, Any]) -> str:
        """``<benchmark>/<part>/...``, the prefix of every figure of the point."""
        parts = (c.key_part(coordinates.get(c.name)) for c in self.coordinates)
        return "/".join([self.name, *filter(None, parts)])

    @property
    def swept(self) -> tuple[Coordinate, ...]:
        """The coordinates of the workflow's sweep, in key order."""
        return tuple(c for c in self.coordinates if c.swept)

    def folder(self, point: Point) -> str:
        """The folder of a workflow job: the key parts of the swept coordinates, in key order
        (``allreduce/numpy/ranks=2/binding=cores``)."""
        return "/".join(filter(None, (c.key_part(point[c.name]) for c in self.swept)))

    def _folder_of(self, part: Callable[[Coordinate], str], optional: str) -> str:
        """The swept coordinates' ``part`` joined by ``/``, an implied one's wrapped in
        ``optional`` (a format of one ``{}``)."""
        first, *rest = self.swept  # never implied: a folder starts with it
        return part(first) + "".join(
            f"/{part(c)}" if c.implied is None else optional.format(f"/{part(c)}") for c in rest)

    def _folder_regex(self, group: bool) -> str:
        return self._folder_of(lambda c: c.part_pattern(group), "(?:{})?")

    def folder_pattern(self) -> str:
        """A regex of :meth:`folder`, without groups (a Snakemake wildcard constraint)."""
        return self._folder_regex(group=False)

    def folder_form(self) -> str:
        """:meth:`folder` as a message shows the accepted form."""
        return self._folder_of(Coordinate.part_form, "[{}]")

    def parse_folder(self, text: str) -> dict[str, Any]:
        """The point a :meth:`folder` names; :class:`FolderError` for any other text (one
        that spells a point another way too: ``nodes=1``, ``ranks=02``)."""
        found = re.fullmatch(self._folder_regex(group=True), text)
        point = {c.name: c.parse(found[c.name]) for c in self.swept} if found else None
        if point is None or self.folder(point) != text:
            raise FolderError(f"{self.name} folder {text!r} is not {self.folder_form()}")
        return point

    def options(self, point: Point) -> list[str]:
        """The producer's options for the swept coordinates of ``point``, in key order."""
        return [word for c in self.swept for word in c.arguments(point)]

    def metric(self, name: str) -> Metric | None:
        """The metric called ``name``, or None."""
        return next((m for m in self.metrics if m.name == name), None)

    def ok_schema(self) -> dict[str, Any]:
        """JSON Schema of this benchmark's fields in an ``ok`` record: ``fields`` with every
        metric added at its path (``latency_us.avg`` makes ``latency_us`` an object). The
        parts of an optional object come together (``native_latency_us``'s avg, min and
        max); an optional metric inside a required one may be absent (``step_ms.mean``)."""
        schema = copy.deepcopy(dict(self.fields))
        required, properties = schema.setdefault("required", []), schema.setdefault(
            "properties", {})
        always = {m.name.partition(".")[0] for m in self.metrics if m.required}
        for metric in self.metrics:
            outer, _, inner = metric.name.partition(".")
            if metric.required and outer not in required:
                required.append(outer)
            if not inner:
                properties[outer] = dict(metric.schema)
                continue
            container = properties.setdefault(outer, {"type": "object"})
            if metric.required or outer not in always:
                container.setdefault("required", []).append(inner)
            container.setdefault("properties", {})[inner] = dict(metric.schema)
        return schema
