"""What the collectives benchmark's records hold, declared once for the results pipeline.

A point is (op, buffer kind, dtype, ranks, nodes, binding, message size); its key reads
``collectives/<op>/<buffer>/<dtype>/ranks=<n>/binding=<name>/size=<bytes>`` on one node
and ``.../ranks=<n>/nodes=<m>/binding=...`` on several. A workflow job sweeps op, buffer,
ranks, nodes and binding (its folder: ``<op>/<buffer>/ranks=<n>[/nodes=<m>]/binding=<name>``);
one job measures every size. Latency is checked in every run,
bus bandwidth too where the op moves data (not barrier). A record's figures are medians
over its ``repeats``, which keep each repeat's own (the samples the check's rank test
compares). The native loop's latency and Python's overhead (mpi4py loop minus native loop)
are in every record timed by both loops, absent where the native loop was off or not built.
"""

from __future__ import annotations

from typing import Any

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES, OPS
from hpcmem.collectives.options import THREAD_LEVELS
from hpcmem.hbw.native import BACKENDS
from hpcmem.node.applied import binding_label
from hpcmem.record.spec import HIGHER, LOWER, NONNEGATIVE, Benchmark, Coordinate, Metric

__all__ = ["COLLECTIVES"]


def _moves_data(point: Any) -> bool:
    """Bandwidth exists only where messages have a size (barrier has none)."""
    return bool(point["size_bytes"])


COLLECTIVES = Benchmark(
    name="collectives",
    coordinates=(
        Coordinate("op", swept=True, option="--op"),
        Coordinate("buffer", swept=True, option="--buffer"),
        Coordinate("dtype"),
        # the launcher starts the ranks on the nodes; `hpcmem bind` applies the binding
        Coordinate("ranks", "ranks", integer=True, swept=True),
        # records from before the nodes axis ran on one node; one-node keys leave it out
        Coordinate("nodes", "nodes", integer=True, read=lambda record: record.get("nodes", 1),
                   implied=1, swept=True),
        Coordinate("binding", "binding", read=lambda record: binding_label(record.get("binding")),
                   swept=True),
        Coordinate("size_bytes", "size", integer=True),
    ),
    metrics=(
        Metric("latency_us.avg", "us", LOWER, checked=True),
        Metric("latency_us.min", "us", LOWER),
        Metric("latency_us.max", "us", LOWER),
        Metric("busbw_GBps", "GB/s", HIGHER, checked=True, applies=_moves_data),
        Metric("algbw_GBps", "GB/s", HIGHER, applies=_moves_data),
        Metric("native_latency_us.avg", "us", LOWER, required=False),
        Metric("native_latency_us.min", "us", LOWER, required=False),
        Metric("native_latency_us.max", "us", LOWER, required=False),
        Metric("python_overhead_us", "us", LOWER, required=False, schema={"type": "number"}),
        Metric("placement.hbw_fraction", "fraction", HIGHER,
               schema={"type": ["number", "null"], "minimum": 0, "maximum": 1}),
    ),
    fields={
        "required": ["op", "buffer", "placement", "ranks", "size_bytes", "iterations",
                     "warmup", "validated", "mpi_library"],
        "properties": {
            "op": {"enum": list(OPS)},
            "buffer": {"enum": list(BUFFER_KINDS)},
            "dtype": {"enum": list(DTYPES)},
            "placement": {"type": "object", "required": ["nodes", "emulated"],
                          "properties": {"nodes": {"type": "object"},
                                         "emulated": {"type": "boolean"}}},
            "ranks": {"type": "integer", "minimum": 1},
            "nodes": {"type": "integer", "minimum": 1},
            "tasks_per_node": {"type": "integer", "minimum": 1},
            "hosts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "size_bytes": {"type": "integer", "minimum": 0},
            "iterations": {"type": "integer", "minimum": 1},
            "warmup": {"type": "integer", "minimum": 0},
            "validated": {"type": "boolean"},
            "mpi_library": {"type": "string"},
            "repeats": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["latency_us"],
                "properties": {"latency_us": {"type": "object", "required": ["avg", "min", "max"]},
                               "algbw_GBps": NONNEGATIVE, "busbw_GBps": NONNEGATIVE}}},
            "injected_slowdown_us": {"type": "number", "exclusiveMinimum": 0},
            "mpi_thread_level": {"enum": list(THREAD_LEVELS)},
            "native_unavailable": {"type": "string"},
            "hbw_backend": {"type": "object", "required": ["name", "version"],
                            "properties": {"name": {"enum": [*BACKENDS, None]}}},
            "vm_topology": {"type": "object", "required": ["name", "note"]},
        },
    },
    metadata={"mpi_libraries": "mpi_library"},
    sanity=lambda record: None if record["validated"] else (
        "status ok but validated is false: the result was not checked correct"),
)
