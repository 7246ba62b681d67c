"""Graylog Extended Log Format 1.1: one JSON message per figure, one per line.

Each message has GELF's required fields (``version`` 1.1, ``host``, ``short_message``,
``timestamp`` in seconds, syslog ``level``: 3 for a FAIL, 4 for NOISY and UNJUDGED, 6
otherwise) and the figure as additional fields (``_system``, ``_partition``, ``_point``,
``_metric``, ``_value``, ``_unit``, ``_verdict`` ...), each a string or a number as GELF
allows. Graylog's GELF HTTP input takes each line as it is; its TCP input takes them with
a NUL byte after each.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from hpcmem.results.export.rows import ExportRow

__all__ = ["gelf_messages"]

#: syslog levels by verdict
_LEVELS = {"FAIL": 3, "NOISY": 4, "UNJUDGED": 4}
_INFO = 6


def gelf_messages(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The rows as GELF 1.1 messages, one JSON document a line."""
    for row in rows:
        verdict = f" ({row.verdict})" if row.verdict else ""
        message = {
            "version": "1.1",
            "host": row.host or row.cluster or "unknown",
            "short_message": f"hpcmem {row.figure} = {row.value:.6g} {row.unit}{verdict}",
            "timestamp": row.time.timestamp(),
            "level": _LEVELS.get(row.verdict or "", _INFO),
            "_system": row.system, "_cluster": row.cluster, "_partition": row.partition,
            "_benchmark": row.benchmark, "_point": row.point, "_metric": row.metric,
            "_value": row.value, "_unit": row.unit, "_run": row.run_id,
        }
        optional = {"_verdict": row.verdict, "_reference": row.reference,
                    "_lower_bound": row.lower_bound, "_upper_bound": row.upper_bound}
        message.update((key, value) for key, value in optional.items() if value is not None)
        yield json.dumps(message, separators=(",", ":"))
