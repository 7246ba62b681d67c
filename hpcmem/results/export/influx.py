"""InfluxDB line protocol (1.x ``/write``, 2.x ``/api/v2/write``): one line per figure.

Measurement ``hpcmem``; tags system, cluster, partition, benchmark, point, metric, run
and verdict (when known); fields ``value`` (float) and ``unit`` (string); the run's time
in nanoseconds. Tag values are escaped as the protocol asks (``,``, ``=`` and space).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from hpcmem.results.export.rows import ExportRow

__all__ = ["MEASUREMENT", "influx_lines"]

MEASUREMENT = "hpcmem"
_TAG_SPECIALS = re.compile(r"([,= \\])")


def _tag(value: str) -> str:
    return _TAG_SPECIALS.sub(r"\\\1", value)


def _string_field(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def influx_lines(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The rows as line protocol, timestamps in nanoseconds."""
    for row in rows:
        tags = {"system": row.system, "cluster": row.cluster, "partition": row.partition,
                "benchmark": row.benchmark, "point": row.point, "metric": row.metric,
                "run": row.run_id, "verdict": row.verdict or ""}
        tagged = ",".join(f"{key}={_tag(value)}" for key, value in tags.items() if value)
        stamp = round(row.time.timestamp() * 10**6) * 1000
        yield (f"{MEASUREMENT},{tagged} value={row.value!r},unit={_string_field(row.unit)} "
               f"{stamp}")
