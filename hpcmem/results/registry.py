"""The benchmarks the results pipeline knows, by name: each declared next to its producer.

This is the one place ``hpcmem.results`` imports a producer package: every benchmark's
:class:`~hpcmem.draw.reporting.Reporting` (which carries its spec). Adding a benchmark is
adding its reporting here; adding a metric changes only the benchmark's own spec.
"""

from __future__ import annotations

from hpcmem.collectives.reporting import REPORTING as COLLECTIVES_REPORTING
from hpcmem.draw.reporting import Reporting
from hpcmem.record.spec import Benchmark, Metric
from hpcmem.train.reporting import REPORTING as TRAIN_REPORTING

__all__ = ["BENCHMARKS", "REPORTS", "metric"]

REPORTS: dict[str, Reporting] = {
    reporting.spec.name: reporting for reporting in (COLLECTIVES_REPORTING, TRAIN_REPORTING)
}
BENCHMARKS: dict[str, Benchmark] = {name: reporting.spec for name, reporting in REPORTS.items()}


def metric(name: str) -> Metric:
    """The metric called ``name`` in any benchmark (names are unique across them);
    KeyError when no benchmark measures it."""
    for spec in BENCHMARKS.values():
        if (found := spec.metric(name)) is not None:
            return found
    raise KeyError(name)
