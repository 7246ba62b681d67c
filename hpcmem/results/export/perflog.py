"""ReFrame-style performance log lines, one per figure, as ReFrame's ``filelog`` handler
writes them with its classic format (here cut in two)::

    2026-11-29T03:11:00+0000|hpcmem 0.1.0|collectives/allreduce/... on hpc1:batch using
    hpcmem|jobid=none|latency_us.avg=1.0|ref=1.1 (l=-0.1, u=0.1)|us|result=PASS

``ref`` is the reference (0 when there is none), ``l`` and ``u`` the band around it as
fractions (``null`` when open), as ReFrame writes them; ``result`` the figure's verdict
(``none`` without one). Tools that parse ReFrame perflogs split on ``|``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hpcmem import __version__
from hpcmem.results.export.rows import ExportRow

__all__ = ["perflog_lines"]


def _fraction(bound: float | None, reference: float | None) -> str:
    if bound is None or not reference:
        return "null"
    return f"{bound / reference - 1:.6g}"


def perflog_lines(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The rows as perflog lines."""
    for row in rows:
        when = row.time.strftime("%Y-%m-%dT%H:%M:%S%z")
        low = _fraction(row.lower_bound, row.reference)
        high = _fraction(row.upper_bound, row.reference)
        yield (f"{when}|hpcmem {__version__}|{row.point} on {row.system} using hpcmem|"
               f"jobid=none|{row.metric}={row.value}|ref={row.reference or 0} "
               f"(l={low}, u={high})|{row.unit}|result={row.verdict or 'none'}")
