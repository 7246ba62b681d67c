"""The benchmarks the results pipeline knows, by name: each declared next to its producer.

This is the one place ``hpcmem.results`` imports a producer package: every benchmark's
:class:`~hpcmem.draw.reporting.Reporting` (which carries its spec). Adding a benchmark is
adding its reporting here; adding a metric changes only the benchmark's own spec.
"""

from __future__ import annotations

from typing import Any

from hpcmem.collectives.reporting import REPORTING as COLLECTIVES_REPORTING
from hpcmem.draw.reporting import Reporting
from hpcmem.peers.reporting import REPORTING as PEERS_REPORTING
from hpcmem.record.spec import Benchmark, Metric
from hpcmem.train.reporting import REPORTING as TRAIN_REPORTING

__all__ = ["BENCHMARKS", "REPORTS", "adopt", "metric"]

REPORTS: dict[str, Reporting] = {
    reporting.spec.name: reporting
    for reporting in (COLLECTIVES_REPORTING, TRAIN_REPORTING, PEERS_REPORTING)
}
BENCHMARKS: dict[str, Benchmark] = {name: reporting.spec for name, reporting in REPORTS.items()}


def metric(name: str) -> Metric:
    """The metric called ``name`` in any benchmark (a name two benchmarks share is one figure,
    with one unit and one direction: a step's median time); KeyError when no benchmark
    measures it."""
    for spec in BENCHMARKS.values():
        if (found := spec.metric(name)) is not None:
            return found
    raise KeyError(name)


def adopt(record: Any) -> Any:
    """``record`` as the record contract's: as it is where it names its benchmark (or is not
    an object), else as the benchmark whose producer writes its shape reads it (the peers'
    ``benchmarks/gpu/hf_offload.py``); a ValueError names the field that benchmark refuses."""
    if not isinstance(record, dict) or "benchmark" in record:
        return record
    for spec in BENCHMARKS.values():
        if spec.adopt is not None and (adopted := spec.adopt(record)) is not None:
            return adopted
    return record
