"""The record schema of every registered benchmark, and validation against it.

The common fields are the record contract's (``hpcmem/record/schemas/record.schema.json``);
an ``ok`` record adds its benchmark's own fields, as the benchmark's spec declares them.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from hpcmem.results.registry import BENCHMARKS

__all__ = ["record_schema", "validate_record"]


@cache
def record_schema() -> dict[str, Any]:
    """The JSON Schema of one result record: the common fields and, for an ``ok`` record,
    its benchmark's own fields."""
    text = resources.files("hpcmem.record.schemas").joinpath("record.schema.json").read_text()
    schema = json.loads(text)
    for spec in BENCHMARKS.values():
        ok = {"benchmark": {"const": spec.name}, "status": {"const": "ok"}}
        schema["allOf"].append({"if": {"properties": ok}, "then": spec.ok_schema()})
    return schema


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(record_schema())


def validate_record(record: dict[str, Any]) -> list[str]:
    """Every schema violation of ``record`` as a readable line; empty when valid."""
    validator = _validator()
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '<record>'}: {error.message}"
        for error in sorted(validator.iter_errors(record), key=lambda e: list(e.absolute_path))
    ]
