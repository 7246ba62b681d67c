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

import os
import shlex
from collections.abc import Mapping
from typing import Any

from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.node.state import YIELD_ENV
from hpcmem.train.spec import TRAIN

__all__ = ["collectives_command", "run_env", "train_command", "train_launch"]

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


#: the sweep's settings passed to every training point when the config sets them
_TRAIN_SETTINGS = (("device", "--device"), ("batch", "--batch"), ("seq_len", "--seq-len"),
                   ("vocab", "--vocab"), ("dtype", "--dtype"))


def train_command(config: Config, point: Mapping[str, Any], records: str,
                  hpcmem: str = "hpcmem") -> list[str]:
    """``hpcmem train ... --skip-if-no-gpu``: one training point (skipped without a GPU);
    ``--world-size N`` for a point of N GPUs, run on each of its ranks.

    >>> config = {"train": {"policy_files": {}, "steps": 2, "warmup": 0, "device": "cpu",
    ...           "dtype": "fp32"}}
    >>> point = {"model": "transformer", "params": 1000000, "policy": "cuda",
    ...          "gpu_budget": None, "world_size": 2}
    >>> " ".join(train_command(config, point, "out.jsonl"))  # doctest: +NORMALIZE_WHITESPACE
    'hpcmem train --model transformer --params 1000000 --policy cuda --world-size 2
     --steps 2 --warmup 0 --device cpu --dtype fp32 --skip-if-no-gpu --output out.jsonl'
    """
    sweep, name = config["train"], point["policy"]
    policy = sweep["policy_files"].get(name, name)
    settings = []
    for key, option in _TRAIN_SETTINGS:
        if sweep.get(key) not in (None, "cuda"):  # cuda: hpcmem train's own default device
            settings += [option, str(sweep[key])]
    return [hpcmem, "train", *TRAIN.options({**point, "policy": policy}),
            "--steps", str(sweep["steps"]), "--warmup", str(sweep["warmup"]), *settings,
            "--skip-if-no-gpu", "--output", records]  # fmt: skip


#: the port the ranks of a point meet at under srun: this plus the job id modulo 20000
_PORT_BASE = 20000


def train_launch(layout: Any, launcher: str, python: str) -> list[str]:
    """The words before a training point's command: none for one rank; for several, the
    rule's launcher (``resources.mpi``) with the layout's options: under srun the first
    node of the job as ``MASTER_ADDR`` and a port of the job's own as ``MASTER_PORT``
    (``hpcmem train`` reads Slurm's ranks) and a rank that dies ending the others
    (``--kill-on-bad-exit``: they would wait in a collective for gloo's or NCCL's timeout;
    srun's error names the task and node), else ``torchrun --standalone`` (one node, which
    ends the other ranks itself) running the command as it is (``--no-python``).

    >>> from hpcmem.workflow.layout import Layout
    >>> " ".join(train_launch(Layout(2, 1), "srun", "python"))  # doctest: +ELLIPSIS
    'sh -c ... srun --nodes=2 --ntasks-per-node=1 --ntasks=2 --kill-on-bad-exit=1'
    >>> train_launch(Layout(1, 2), "torchrun", "python")
    ['python', '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', \
'--no-python']
    """
    if layout.ranks == 1:
        return []
    words = shlex.split(launcher) or ["torchrun"]
    if os.path.basename(words[0]) == "srun":
        options = [f"--nodes={layout.nodes}", f"--ntasks-per-node={layout.tasks_per_node}",
                   f"--ntasks={layout.ranks}", "--kill-on-bad-exit=1"]
        # the rendezvous: the job's first node, a port derived from the job id (two jobs
        # sharing a node meet at different ports)
        # (this host, where the job's script runs, when the job's variables are not seen)
        rendezvous = ('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null'
                      ' | head -n 1)"; export MASTER_ADDR="${MASTER_ADDR:-$(hostname)}"; '
                      f'export MASTER_PORT=$(({_PORT_BASE} + ${{SLURM_JOB_ID:-$$}} % 20000)); '
                      'exec "$@"')
        return ["sh", "-c", rendezvous, "sh", *words, *options]
    if os.path.basename(words[0]) == "torchrun":
        words = [python, "-m", "torch.distributed.run"]
    return [*words, "--standalone", "--nproc-per-node", str(layout.ranks), "--no-python"]
