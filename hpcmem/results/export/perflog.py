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
from hpcmem.results.export.rows import ExportRow, band_fraction

__all__ = ["perflog_lines"]


def _text(fraction: float | None) -> str:
    return "null" if fraction is None else f"{fraction:.6g}"


def perflog_lines(rows: Iterable[ExportRow]) -> Iterator[str]:
    """The rows as perflog lines."""
    for row in rows:
        when = row.time.strftime("%Y-%m-%dT%H:%M:%S%z")
        low, high = (band_fraction(bound, row.reference)
                     for bound in (row.lower_bound, row.upper_bound))
        yield (f"{when}|hpcmem {__version__}|{row.point} on {row.system} using hpcmem|"
               f"jobid=none|{row.metric}={row.value}|ref={row.reference or 0} "
               f"(l={_text(low)}, u={_text(high)})|{row.unit}|result={row.verdict or 'none'}")
