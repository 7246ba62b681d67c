"""OSU-style text output, column for column like ``osu_<op> -f`` (full output).

OSU prints ``%-10d`` for the size, ``%18.2f`` for each latency and ``%12d`` for
the iteration count; osu_barrier has no size column and prints its average
latency in 17 columns. Lines hpcmem adds start with ``#`` so
``grep -v '^#'`` leaves rows that diff against OSU's.
"""

from __future__ import annotations

from hpcmem.collectives.ops import Op
from hpcmem.collectives.timing import Latency

__all__ = ["column_header", "header_lines", "native_lines", "note_line", "row"]

FIELD_WIDTH = 18
PRECISION = 2
SIZE_WIDTH = 10
ITERATIONS_WIDTH = 12
_NO_SIZE_WIDTH = 17


def column_header(op: Op) -> str:
    """The column header line (``# Size  Avg Latency(us) ...``)."""
    first = (
        f"{'# Size':<{SIZE_WIDTH}}{'Avg Latency(us)':>{FIELD_WIDTH}}"
        if op.sized
        else "# Avg Latency(us)"
    )
    return (
        f"{first}{'Min Latency(us)':>{FIELD_WIDTH}}{'Max Latency(us)':>{FIELD_WIDTH}}"
        f"{'Iterations':>{ITERATIONS_WIDTH}}"
    )


def header_lines(op: Op, buffer_note: str) -> list[str]:
    """The lines that open one table: OSU's title, hpcmem's buffer comment, the column header."""
    return [
        f"# OSU MPI {op.title} Latency Test",
        f"# hpcmem buffer: {buffer_note}",
        column_header(op),
    ]


def row(op: Op, size: int, latency: Latency, iterations: int) -> str:
    """One data row."""
    if op.sized:
        first = f"{size:<{SIZE_WIDTH}d}{latency.avg:>{FIELD_WIDTH}.{PRECISION}f}"
    else:
        first = f"{latency.avg:>{_NO_SIZE_WIDTH}.{PRECISION}f}"
    return (
        f"{first}{latency.min:>{FIELD_WIDTH}.{PRECISION}f}{latency.max:>{FIELD_WIDTH}.{PRECISION}f}"
        f"{iterations:>{ITERATIONS_WIDTH}d}"
    )


def note_line(status: str, reason: str, size: int | None = None) -> str:
    """A comment line for a skipped or failed point (``# skipped: ...``)."""
    where = f" (size {size})" if size is not None else ""
    return f"# {status}{where}: {reason}"


def native_lines(op: Op, records: list[dict], unavailable: str | None = None) -> list[str]:
    """The ``#`` block after a table: per size, the native C loop's average latency on the
    same buffers and Python's overhead (the table's average minus it); or why there is none."""
    if unavailable:
        return [note_line("native loop unavailable", unavailable)]
    timed = [r for r in records if "native_latency_us" in r]
    if not timed:
        return []
    lines = [
        "# hpcmem native loop (C, same buffers); Python overhead = Avg Latency - Native Avg",
        f"{'# Size' if op.sized else '#':<{SIZE_WIDTH}}{'Native Avg(us)':>{FIELD_WIDTH}}"
        f"{'Python overhead(us)':>{FIELD_WIDTH + 2}}",
    ]
    for record in timed:
        size = f"{record['size_bytes']:<{SIZE_WIDTH - 2}d}" if op.sized else " " * (SIZE_WIDTH - 2)
        lines.append(
            f"# {size}{record['native_latency_us']['avg']:>{FIELD_WIDTH}.{PRECISION}f}"
            f"{record['python_overhead_us']:>+{FIELD_WIDTH + 2}.{PRECISION}f}"
        )
    return lines
