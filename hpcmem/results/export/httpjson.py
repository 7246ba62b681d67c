"""ReFrame ``httpjson``-style documents: one JSON object per point, as ReFrame's httpjson
perflog handler posts one per test.

Each holds ``check_name`` (the point's key), ``check_system``, ``check_partition``,
``check_job_completion_time`` (ISO 8601), ``check_result`` (``fail`` when a figure of the
point failed, ``pass`` when it was judged otherwise; absent without a verdict) and, per
metric ``M``, ReFrame's flattened ``check_perf_M_value``, ``_unit``, ``_ref`` (0 without a
reference), ``_lower_thres`` and ``_upper_thres`` (fractions of the reference, null when
open) and hpcmem's ``_verdict``; then ``hpcmem_benchmark``, ``hpcmem_run``, ``hpcmem_host``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from hpcmem.results.export.rows import ExportRow, band_fraction

__all__ = ["httpjson_documents", "httpjson_lines"]


def _result(rows: list[ExportRow]) -> str | None:
    verdicts = [row.verdict for row in rows if row.verdict]
    if not verdicts:
        return None
    return "fail" if "FAIL" in verdicts else "pass"


def httpjson_documents(rows: Iterable[ExportRow]) -> Iterator[dict[str, Any]]:
    """One document per point (and system), its figures flattened into it."""
    points: dict[tuple[str, str], list[ExportRow]] = {}
    for row in rows:
        points.setdefault((row.point, row.system), []).append(row)
    for (point, _), figures in points.items():
        first = figures[0]
        document: dict[str, Any] = {
            "check_name": point, "check_system": first.cluster,
            "check_partition": first.partition,
            "check_job_completion_time": first.time.isoformat()}
        if (result := _result(figures)) is not None:
            document["check_result"] = result
        for row in figures:
            perf = f"check_perf_{row.metric}"
            document.update({
                f"{perf}_value": row.value, f"{perf}_unit": row.unit,
                f"{perf}_ref": row.reference or 0,
                f"{perf}_lower_thres": band_fraction(row.lower_bound, row.reference),
                f"{perf}_upper_thres": band_fraction(row.upper_bound, row.reference),
                f"{perf}_verdict": row.verdict})
        document.update(hpcmem_benchmark=first.benchmark, hpcmem_run=first.run_id,
                        hpcmem_host=first.host)
        yield document


def httpjson_lines(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The documents, one JSON object a line."""
    for document in httpjson_documents(rows):
        yield json.dumps(document, separators=(",", ":"))
