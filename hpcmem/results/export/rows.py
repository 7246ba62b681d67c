"""The figures a run's summary holds, one :class:`ExportRow` each, for the exporters.

Every metric of every point that has a finite value, with the tags a dashboard selects by
(system, cluster, partition, benchmark, point, metric) and, given the verdict of
``hpcmem check``, the figure's verdict and reference band. A verdict of another run than
the summary's is refused (:class:`ExportError`, exit 2) rather than tagged onto it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hpcmem.errors import BadInputError
from hpcmem.results.registry import BENCHMARKS
from hpcmem.results.summary import Summary, run_id

__all__ = ["ExportError", "ExportRow", "band_fraction", "export_rows"]


class ExportError(BadInputError):
    """A summary and verdict that cannot be exported together; the message names why."""


@dataclass(frozen=True)
class ExportRow:
    """One figure of one point, with its tags."""

    #: ``cluster:partition`` the point is judged for
    system: str
    benchmark: str
    #: the point's key (``collectives/allreduce/hbw/.../size=8``)
    point: str
    metric: str
    value: float
    unit: str
    #: when the run's last record was written
    time: datetime
    run_id: str
    host: str
    #: from the verdict file, when given
    verdict: str | None = None
    reference: float | None = None
    lower_bound: float | None = None
    upper_bound: float | None = None

    @property
    def cluster(self) -> str:
        return self.system.partition(":")[0]

    @property
    def partition(self) -> str:
        return self.system.partition(":")[2]

    @property
    def figure(self) -> str:
        """The figure's name as the verdict file has it."""
        return f"{self.point}/{self.metric}"


def band_fraction(bound: float | None, reference: float | None) -> float | None:
    """A band's bound as ReFrame gives it: a fraction of the reference (``-0.1`` for 10%
    below), None when the band is open there or there is no reference."""
    if bound is None or not reference:
        return None
    return bound / reference - 1


def _run_time(summary: Summary) -> datetime:
    meta = summary.metadata
    stamp = meta.get("last_timestamp") or meta.get("aggregated_at")
    try:
        return datetime.fromisoformat(str(stamp))
    except ValueError:
        raise ExportError(f"{summary.folder / 'metadata.json'}: last_timestamp: {stamp!r} is "
                          "not an ISO 8601 time") from None


def _verdict_rows(summary: Summary, verdict: dict[str, Any] | None) -> dict[str, dict]:
    """The verdict's figures by name, once its run is known to be the summary's."""
    if verdict is None:
        return {}
    if verdict.get("run_id") != run_id(summary):
        raise ExportError(f"--verdict: run_id: {verdict.get('run_id')!r} is not the summary's "
                          f"run ({run_id(summary)!r})")
    return {figure["figure"]: figure for figure in verdict["figures"]}


def export_rows(summary: Summary, systems: dict[str, str],
                verdict: dict[str, Any] | None = None) -> Iterator[ExportRow]:
    """Every finite figure of the summary; ``systems``: each point's system
    (:func:`~hpcmem.results.systems.point_systems`)."""
    judged, time = _verdict_rows(summary, verdict), _run_time(summary)
    for point in summary.points.to_dict("records"):
        for metric in BENCHMARKS[point["benchmark"]].metrics:
            value = point.get(metric.name)
            if not (metric.applies(point) and isinstance(value, int | float)
                    and not isinstance(value, bool) and math.isfinite(value)):
                continue
            row = judged.get(f"{point['point']}/{metric.name}", {})
            yield ExportRow(
                system=row.get("system") or systems[point["point"]],
                benchmark=point["benchmark"], point=point["point"], metric=metric.name,
                value=float(value), unit=metric.unit, time=time,
                run_id=str(point.get("run_ids") or ""), host=str(point.get("hosts") or ""),
                verdict=row.get("verdict"), reference=row.get("reference"),
                lower_bound=row.get("lower_bound"), upper_bound=row.get("upper_bound"))
