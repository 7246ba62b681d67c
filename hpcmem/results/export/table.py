"""The figures as CSV: one row per figure, a header first."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator

from hpcmem.results.export.rows import ExportRow

__all__ = ["CSV_COLUMNS", "csv_lines"]

CSV_COLUMNS = ("time", "system", "cluster", "partition", "benchmark", "point", "metric",
               "value", "unit", "verdict", "reference", "lower_bound", "upper_bound", "run",
               "host")


def csv_lines(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The header, then one CSV line per row (empty cells for what is not known)."""
    def line(cells: Iterable[object]) -> str:
        text = io.StringIO()
        csv.writer(text, lineterminator="").writerow(
            "" if cell is None else cell for cell in cells)
        return text.getvalue()

    yield line(CSV_COLUMNS)
    for row in rows:
        yield line((row.time.isoformat(), row.system, row.cluster, row.partition,
                    row.benchmark, row.point, row.metric, repr(row.value), row.unit,
                    row.verdict, row.reference, row.lower_bound, row.upper_bound,
                    row.run_id, row.host))
