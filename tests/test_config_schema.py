"""The config against its schema (hpcmem/workflow/config.py), called in-process: an
unknown key is one line naming it and the nearest accepted ones, any other refusal one
line naming the key and what it accepts, never the schema itself. test_workflow_config.py
runs the same through snakemake."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.workflow.config import ConfigError, validate_config

SCHEMA = str(Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml")
DOCS = "every key is described in docs/configuration.md"


@pytest.mark.parametrize(("config", "message"), [
    ({"foo": 1}, "config foo: unknown key (accepted here: run_id, output_dir, container, "
                 f"collectives, train, check; {DOCS})"),
    ({"colectives": {}}, f"config colectives: unknown key (nearest: collectives; {DOCS})"),
    ({"collectives": {"op": ["bcast"]}},
     f"config collectives.op: unknown key (nearest: ops; {DOCS})"),
    ({"container": {"cpu_imag": "x.sif"}},
     f"config container.cpu_imag: unknown key (nearest: cpu_image, gpu_image; {DOCS})"),
    ({"check": {"references": "r.yaml", 7: "x"}},
     "config check.7: unknown key (accepted here: references, history, fail_on_regression; "
     f"{DOCS})"),
], ids=["top", "typo", "nested", "nearest-two", "not-a-string"])  # fmt: skip
def test_an_unknown_key_is_named_with_the_nearest_accepted(config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
    assert str(error.value) == message


@pytest.mark.parametrize(("config", "message"), [
    ({"collectives": {"tasks_per_node": ["abc"]}},
     "config collectives.tasks_per_node[0]: 'abc' is not of type 'integer' (accepted: MPI "
     "ranks on each node; a point has nodes x tasks_per_node ranks.)"),
    ({"collectives": {"min_size": 0}},
     "config collectives.min_size: 0 is not valid under any of the given schemas (accepted: "
     "Smallest message size. A message size in bytes, a power of two; an integer or a string "
     "with a K/M/G unit (8, 4K, 1M).)"),
    ({"collectives": {"custom_bindings": {"n0": "--membind=0; touch x"}}},
     "config collectives.custom_bindings.n0: '--membind=0; touch x' does not match the key's "
     "pattern (accepted: Explicit numactl arguments, long options only, separated by single "
     "spaces: --cpunodebind=NODES, --membind=NODES, --interleave=NODES, --physcpubind=CPUS, "
     "--preferred=NODE, --localalloc.)"),
    ({"run_id": "a\udcff"}, "config run_id: 'a\\udcff' does not match the key's pattern"),
], ids=["type", "one-of", "pattern", "not-utf8"])  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_key(config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
    text = str(error.value)
    assert text.startswith(message) and "\n" not in text and len(text) < 600, text


def test_a_valid_config_gets_every_default() -> None:
    config: dict = {"collectives": {"ops": ["bcast"]}}
    validate_config(config, SCHEMA)
    assert config["collectives"]["ops"] == ["bcast"]
    assert config["collectives"]["repeats"] == 5 and config["output_dir"] == "results"
