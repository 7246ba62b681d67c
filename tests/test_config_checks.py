"""The checks beyond the config schema (hpcmem/workflow/config.py), called on the
default config with one change each. test_workflow_config.py runs the same through
snakemake, which prints each message as its one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
from workflow_configs import load

from hpcmem.workflow.config import ConfigError, check_config, message_size


@pytest.mark.parametrize(("change", "message"), [
    ({"collectives": {"bindings": ["hbw", "socket0"]}},
     "config collectives.bindings: 'socket0' is not one of none, cores, hbw, dram, interleave "
     "(define new ones under collectives.custom_bindings)"),
    ({"train": {"policies": ["fast"]}},
     "config train.policies: 'fast' is not one of cuda, hpcmem, um (define new ones under "
     "train.policy_files)"),
    ({"collectives": {"max_size": "3K"}},
     "config collectives.max_size: '3K' is not a power of two (8, 4K, 1M, ...)"),
    ({"collectives": {"min_size": "1M", "max_size": "4K"}},
     "config collectives.min_size: larger than collectives.max_size"),
    ({"collectives": {"enabled": False}, "train": {"enabled": False}},
     "config collectives.enabled, train.enabled: both false, nothing to run"),
    ({"output_dir": "a-file"}, "config output_dir: 'a-file' is a file, not a folder"),
    ({"check": {"history": "a-file"}}, "config check.history: 'a-file' is a file, not a folder"),
    ({"collectives": {"custom_bindings": {"none": "--membind=0"}}},
     "config collectives.custom_bindings: 'none' is a built-in name (built in: none, cores, "
     "hbw, dram, interleave); give yours another name"),
    ({"train": {"policy_files": {"cuda": "config/mine.yaml"}}},
     "config train.policy_files: 'cuda' is a built-in name (built in: cuda, hpcmem, um); give "
     "yours another name"),
    ({"run_id": "r1\n"}, "config run_id: 'r1\\n' contains a control character"),
    ({"train": {"policy_files": {"mine": "config/mine.yaml\n"}}},
     "config train.policy_files.mine: 'config/mine.yaml\\n' contains a control character"),
])
def test_each_check_names_the_key(change: dict, message: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    config = load("config/config.yaml", extra=change)
    with pytest.raises(ConfigError) as error:
        check_config(config)
    assert str(error.value) == message


@pytest.mark.parametrize("files", [["config/config.yaml"],
                                   ["config/config.yaml", ".test/config/config.yaml"],
                                   ["config/config.yaml", "profiles/slurm/sweep.yaml"]])
def test_the_shipped_configs_pass(files: list[str]) -> None:
    check_config(load(*files))


def test_message_sizes_are_powers_of_two_in_bytes() -> None:
    assert [message_size(value, "k") for value in (8, "64K", "1M")] == [8, 65536, 2**20]
    with pytest.raises(ConfigError, match=r"config k: 12 is not a power of two"):
        message_size(12, "k")
