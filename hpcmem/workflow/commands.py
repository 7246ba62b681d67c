"""The command line of a benchmark job: its environment, and the words it runs for a point.

A point's own options come from its benchmark's spec (:meth:`hpcmem.record.spec.Benchmark.
options`); the sweep's shared settings (sizes, iterations, steps) from the config. Names the
config defines stand for what it defines them as: a custom binding for its numactl
arguments (``hpcmem bind --name`` keeps the name in the records), a policy file's name for
its path.

>>> config = {"collectives": {"custom_bindings": {"node0": "--membind=0"}, "min_size": 8,
...           "max_size": "1K", "iterations": None, "warmup": None, "repeats": 1}}
>>> point = {"op": "bcast", "buffer": "numpy", "ranks": 2, "nodes": 1, "binding": "node0"}
>>> " ".join(collectives_command(config, point, "out.jsonl"))  # doctest: +NORMALIZE_WHITESPACE
'hpcmem bind --skip-unavailable --name node0 -- --membind=0 -- hpcmem collectives --op bcast
 --buffer numpy --min-size 8 --max-size 1K --repeats 1 --output out.jsonl'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.node.state import YIELD_ENV
from hpcmem.train.spec import TRAIN

__all__ = ["collectives_command", "run_env", "train_command"]

Config = Mapping[str, Any]


def run_env(config: Config, git_sha: str) -> list[str]:
    """VAR=value words for ``env``: run id, commit, MEMKIND_HBW_NODES when HBW is emulated,
    and Open MPI's yield-when-idle when collectives.yield_when_idle asks for it."""
    words = [f"HPCMEM_RUN_ID={config['run_id']}"]
    if git_sha:
        words.append(f"HPCMEM_GIT_SHA={git_sha}")
    if config["collectives"]["emulate_hbw"] is not None:
        words.append(f"MEMKIND_HBW_NODES={config['collectives']['emulate_hbw']}")
    if config["collectives"]["yield_when_idle"]:
        words.append(f"{YIELD_ENV}=1")
    return words


def _sweep_options(sweep: Config) -> list[str]:
    """Options of ``hpcmem collectives`` shared by every point of the sweep."""
    options = ["--min-size", str(sweep["min_size"]), "--max-size", str(sweep["max_size"])]
    for key in ("iterations", "warmup"):
        if sweep[key] is not None:
            options += [f"--{key}", str(sweep[key])]
    return [*options, "--repeats", str(sweep["repeats"])]


def collectives_command(config: Config, point: Mapping[str, Any], records: str,
                        hpcmem: str = "hpcmem") -> list[str]:
    """``hpcmem bind --skip-unavailable --name NAME -- BINDING -- hpcmem collectives ...``,
    run on every rank of the point (a binding this node lacks gives skipped records)."""
    sweep, name = config["collectives"], point["binding"]
    binding = sweep["custom_bindings"].get(name, name)
    return [hpcmem, "bind", "--skip-unavailable", "--name", name, "--", binding, "--",
            hpcmem, "collectives", *COLLECTIVES.options(point), *_sweep_options(sweep),
            "--output", records]  # fmt: skip


def train_command(config: Config, point: Mapping[str, Any], records: str,
                  hpcmem: str = "hpcmem") -> list[str]:
    """``hpcmem train ... --skip-if-no-gpu``: one training point (skipped without a GPU)."""
    sweep, name = config["train"], point["policy"]
    policy = sweep["policy_files"].get(name, name)
    return [hpcmem, "train", *TRAIN.options({**point, "policy": policy}),
            "--steps", str(sweep["steps"]), "--warmup", str(sweep["warmup"]),
            "--skip-if-no-gpu", "--output", records]  # fmt: skip
