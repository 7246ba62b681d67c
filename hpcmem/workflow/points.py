"""The points of a workflow run: one job per point, a point being the swept coordinates of its
benchmark's spec (:attr:`hpcmem.record.spec.Benchmark.swept`) with the values its records' keys
use. The spec turns a point into its job's folder and back, and into the producer's options.

Values are the canonical ones of the point keys: a training point's ``params`` is a count
(``default`` resolved to the model's own: 125000000 for the transformer, ResNet-50's 25557032
for the cnn) and its ``gpu_budget`` bytes or None; equal points from different spellings
(``125M`` and ``default``) are one point.

>>> from hpcmem.collectives.spec import COLLECTIVES
>>> config = {"collectives": {"enabled": True, "ops": ["allreduce"], "buffers": ["numpy"],
...           "nodes": [1, 2], "tasks_per_node": [2], "bindings": ["cores"]}}
>>> [COLLECTIVES.folder(point) for point in collectives_points(config)]
['allreduce/numpy/ranks=2/binding=cores', 'allreduce/numpy/ranks=4/nodes=2/binding=cores']
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from hpcmem.train.point import default_params
from hpcmem.train.spec import TRAIN
from hpcmem.units import parse_count, parse_size
from hpcmem.workflow.layout import Layout

__all__ = ["collectives_points", "point_layout", "train_layout", "train_layouts", "train_points"]

Point = dict[str, Any]


def collectives_points(config: Mapping[str, Any]) -> list[Point]:
    """One point per op x buffer x layout (nodes x tasks per node) x binding; [] when the
    collectives are not enabled."""
    sweep = config["collectives"]
    if not sweep["enabled"]:
        return []
    layouts = [Layout(n, t) for n in sweep["nodes"] for t in sweep["tasks_per_node"]]
    axes = (sweep["ops"], sweep["buffers"], layouts, sweep["bindings"])
    return [dict(op=op, buffer=buffer, ranks=layout.ranks, nodes=layout.nodes, binding=binding)
            for op, buffer, layout, binding in itertools.product(*axes)]


def point_layout(point: Mapping[str, Any]) -> Layout:
    """Where a collectives point's ranks run, from its ``nodes`` and ``ranks``."""
    return Layout.spread(nodes=point["nodes"], ranks=point["ranks"])


def _params(model: str, text: str) -> int:
    return default_params(model) if text == "default" else parse_count(text)


def train_layouts(config: Mapping[str, Any]) -> list[Layout]:
    """The training sweep's layouts: ``nodes`` x ``gpus_per_node``, one rank a GPU."""
    sweep = config["train"]
    return [Layout(n, g) for n in sweep.get("nodes", [1])
            for g in sweep.get("gpus_per_node", [1])]


def train_layout(config: Mapping[str, Any], world_size: int) -> Layout:
    """Where a training point's ``world_size`` ranks run: the sweep's layout of that many
    GPUs (the config check makes it one); one node for a point the sweep does not have."""
    found = [layout for layout in train_layouts(config) if layout.ranks == world_size]
    return found[0] if found else Layout(1, world_size)


def train_points(config: Mapping[str, Any]) -> list[Point]:
    """One point per model x params x policy x GPU budget x GPU count (nodes x GPUs per
    node), each once; [] when training is not enabled.

    >>> config = {"train": {"enabled": True, "models": ["transformer"], "params": ["1M"],
    ...           "policies": ["cuda"], "gpu_budgets": ["none"], "nodes": [1, 2],
    ...           "gpus_per_node": [1]}}
    >>> [TRAIN.folder(point) for point in train_points(config)]
    ['transformer/params=1000000/budget=none/policy=cuda', \
'transformer/params=1000000/budget=none/policy=cuda/gpus=2']
    """
    sweep = config["train"]
    if not sweep["enabled"]:
        return []
    gpus = sorted({layout.ranks for layout in train_layouts(config)})
    axes = (sweep["models"], sweep["params"], sweep["policies"], sweep["gpu_budgets"], gpus)
    points = (dict(model=model, params=_params(model, params), policy=policy,
                   gpu_budget=None if budget == "none" else parse_size(budget),
                   world_size=world_size)
              for model, params, policy, budget, world_size in itertools.product(*axes))
    return list({TRAIN.folder(point): point for point in points}.values())  # one job a folder
