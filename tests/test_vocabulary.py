"""Each vocabulary is declared once in the package: the workflow's config schema, the record
schema and the benchmark specs must name exactly the package's constants."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hpcmem.collectives.buffers import BUFFER_KINDS
from hpcmem.collectives.ops import DTYPES as COLLECTIVE_DTYPES
from hpcmem.collectives.ops import OPS
from hpcmem.node.planned import BINDINGS
from hpcmem.record.provenance import STATUSES
from hpcmem.record.spec import HIGHER, LOWER
from hpcmem.results.registry import BENCHMARKS, metric
from hpcmem.results.schema import record_schema
from hpcmem.train.models import MODELS
from hpcmem.train.sizing import DTYPES as TRAIN_DTYPES
from hpcmem.um import PRESETS

REPO = Path(__file__).resolve().parents[1]
CONFIG_SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def _config_items(section: str, key: str) -> dict:
    return CONFIG_SCHEMA["properties"][section]["properties"][key]


@pytest.mark.parametrize(
    ("section", "key", "constant"),
    [("collectives", "ops", list(OPS)), ("collectives", "buffers", list(BUFFER_KINDS)),
     ("train", "models", list(MODELS))],
)
def test_config_schema_enums_are_the_package_constants(section, key, constant):
    assert _config_items(section, key)["items"]["enum"] == constant


def test_config_defaults_name_builtin_bindings_and_presets():
    assert set(_config_items("collectives", "bindings")["default"]) <= set(BINDINGS)
    assert set(_config_items("train", "policies")["default"]) <= set(PRESETS)
    pattern = CONFIG_SCHEMA["$defs"]["name"]["pattern"]
    for name in (*BINDINGS, *PRESETS):  # every built-in name fits the schema's name pattern
        assert re.fullmatch(pattern, name), name


def _ok_part(benchmark: str) -> dict:
    return next(part["then"] for part in record_schema()["allOf"]
                if part["if"]["properties"].get("benchmark") == {"const": benchmark})


def test_record_schema_enums_are_the_package_constants():
    properties = record_schema()["properties"]
    assert properties["benchmark"]["enum"] == list(BENCHMARKS)
    assert properties["status"]["enum"] == list(STATUSES)
    collectives, train = _ok_part("collectives")["properties"], _ok_part("train")["properties"]
    assert collectives["op"]["enum"] == list(OPS)
    assert collectives["buffer"]["enum"] == list(BUFFER_KINDS)
    assert collectives["dtype"]["enum"] == list(COLLECTIVE_DTYPES)
    assert train["model"]["enum"] == list(MODELS)
    assert train["dtype"]["enum"] == list(TRAIN_DTYPES)


def test_every_metric_is_declared_at_its_path_and_required_unless_optional():
    for spec in BENCHMARKS.values():
        schema = _ok_part(spec.name)
        always = {m.name.partition(".")[0] for m in spec.metrics if m.required}
        for measured in spec.metrics:
            outer, _, inner = measured.name.partition(".")
            assert outer in schema["properties"], measured.name
            assert (outer in schema["required"]) == (outer in always), measured.name
            # an optional object's parts come together; an optional part of a required
            # object (the peers' step_ms.mean) may be absent
            if inner:
                assert (inner in schema["properties"][outer].get("required", ())) == (
                    measured.required or outer not in always), measured.name


def test_an_optional_metric_may_be_absent_but_not_malformed():
    from hpcmem.train.spec import TRAIN

    optional = [m for m in TRAIN.metrics if not m.required]
    assert {m.name for m in optional} >= {"bytes_h2d", "bytes_d2h", "peak_gpu_resident_bytes",
                                          "pcie_bound_ms"}
    import jsonschema

    schema = TRAIN.ok_schema()
    base = {"model": "cnn", "params": 1, "batch": 1, "dtype": "fp32", "policy": {"name": "um"},
            "bytes_by_type": {}, "gpu": "g", "torch": "t", "cuda": None, "first_step_ms": 1.0,
            "step_ms": {"median": 1.0, "p10": 1.0, "p90": 1.0}, "throughput": 1.0,
            "oversubscription": 0.1}
    jsonschema.validate(base, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**base, "bytes_h2d": -1}, schema)


def test_metrics_are_named_once_with_a_unit_and_a_direction():
    for spec in BENCHMARKS.values():
        names = [m.name for m in spec.metrics]
        assert len(names) == len(set(names)), f"{spec.name} names a metric twice"
        for measured in spec.metrics:
            # a name two benchmarks share (a step's median time) is one figure: one unit, one
            # direction, one summary column
            found = metric(measured.name)
            assert (found.unit, found.better) == (measured.unit, measured.better), measured.name
            assert measured.name.count(".") <= 1 and found.unit
            assert found.better in (LOWER, HIGHER, None)
    assert [m.name for m in BENCHMARKS["collectives"].metrics if m.checked] == [
        "latency_us.avg", "busbw_GBps"]
    assert [m.name for m in BENCHMARKS["train"].metrics if m.checked] == [
        "step_ms.median", "first_step_ms"]
    assert [m.name for m in BENCHMARKS["peers"].metrics if m.checked] == [
        "step_ms.median", "step_ms.mean", "vs_zero_offload", "vs_best_peer"]
