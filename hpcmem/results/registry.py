"""The benchmarks the results pipeline knows, by name: each declared next to its producer.

Adding a benchmark is adding its spec here; adding a metric changes only the benchmark's
own spec.
"""

from __future__ import annotations

from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.results.spec import Benchmark, Metric
from hpcmem.train.spec import TRAIN

__all__ = ["BENCHMARKS", "metric"]

BENCHMARKS: dict[str, Benchmark] = {spec.name: spec for spec in (COLLECTIVES, TRAIN)}


def metric(name: str) -> Metric:
    """The metric called ``name`` in any benchmark (names are unique across them);
    KeyError when no benchmark measures it."""
    for spec in BENCHMARKS.values():
        if (found := spec.metric(name)) is not None:
            return found
    raise KeyError(name)
