"""One declaration per benchmark names a point four ways: its records' key, the folder of its
workflow job, the producer's options, and the folder read back into the point. The points
come from real configs (the default sweep, the workflow tests', the Slurm site's)."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest
from workflow_configs import load

from hpcmem.cli import collectives as collectives_cli
from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.record.spec import Benchmark, FolderError
from hpcmem.train.point import default_params, make_point
from hpcmem.train.spec import TRAIN
from hpcmem.workflow.points import collectives_points, point_layout, train_points

#: the configs a run loads, as the workflow layers them: the default sweep first
CONFIGS = {
    "default": ["config/config.yaml"],
    "workflow tests": ["config/config.yaml", ".test/config/config.yaml"],
    "slurm site": ["config/config.yaml", "profiles/slurm/sweep.yaml"],
}
#: the cluster sweep commented at the end of config/config.yaml, with a custom binding
CLUSTER = {
    "collectives": {"nodes": [1, 2, 4], "tasks_per_node": [1, 56],
                    "bindings": ["none", "cores", "quadrant0"],
                    "custom_bindings": {"quadrant0": "--cpunodebind=0 --membind=4"}},
    "train": {"models": ["transformer", "cnn"], "params": ["default", "125M", "1.3B"],
              "gpu_budgets": ["none", "16G"]},
}


def every_point() -> list[tuple[Benchmark, dict[str, Any]]]:
    configs = [load(*files) for files in CONFIGS.values()]
    configs.append(load("config/config.yaml", extra=CLUSTER))
    return [(spec, point) for config in configs
            for spec, points in ((COLLECTIVES, collectives_points), (TRAIN, train_points))
            for point in points(config)]


#: what a job measures or derives itself: the rest of its records' coordinates
MEASURED = {"collectives": {"dtype": "float32", "size_bytes": 8},
            "train": {"batch": 8, "accumulate": 1, "seq_len": None, "dtype": "fp32",
                      "delayed_update": False, "state_dtype": "float32"}}


@pytest.mark.parametrize(("spec", "point"), every_point(),
                         ids=lambda value: value.name if isinstance(value, Benchmark) else None)
def test_a_folder_is_the_swept_part_of_its_records_key_and_reads_back(spec: Benchmark,
                                                                      point: dict) -> None:
    folder = spec.folder(point)
    key = spec.point_key({**point, **MEASURED[spec.name]})
    measured = {c.key_part({**point, **MEASURED[spec.name]}[c.name])
                for c in spec.coordinates if not c.swept}
    assert [part for part in key.split("/") if part not in measured] == [spec.name,
                                                                         *folder.split("/")]
    assert re.fullmatch(spec.folder_pattern(), folder)
    assert spec.parse_folder(folder) == point


def test_the_folders_of_the_default_sweep() -> None:
    config = load("config/config.yaml")
    folders = [COLLECTIVES.folder(point) for point in collectives_points(config)]
    assert folders[:2] == ["allreduce/numpy/ranks=2/binding=none",
                           "allreduce/numpy/ranks=2/binding=hbw"]
    assert len(folders) == len(set(folders)) == 12
    assert [TRAIN.folder(point) for point in train_points(config)][:4] == [
        "transformer/params=125000000/budget=none/policy=cuda",
        "transformer/params=125000000/budget=none/policy=um",
        "transformer/params=125000000/budget=none/policy=hpcmem",
        "cnn/params=25557032/budget=none/policy=cuda"]


def test_points_of_several_nodes_name_their_nodes_and_spread_their_ranks() -> None:
    points = collectives_points(load("config/config.yaml", extra=CLUSTER))
    two = next(p for p in points if p["nodes"] == 2 and p["ranks"] == 112)
    assert COLLECTIVES.folder(two) == "allreduce/numpy/ranks=112/nodes=2/binding=none"
    assert point_layout(two).tasks_per_node == 56
    assert {point_layout(p).ranks for p in points} == {1, 56, 2, 112, 4, 224}


def test_one_size_spelt_two_ways_is_one_training_point() -> None:
    config = load("config/config.yaml", extra={"train": {
        "models": ["transformer"], "params": ["default", "125M", "125000K"], "policies": ["um"],
        "gpu_budgets": ["none", "16G", "16384M"]}})
    assert train_points(config) == [
        {"model": "transformer", "params": 125000000, "policy": "um", "gpu_budget": None,
         "world_size": 1},
        {"model": "transformer", "params": 125000000, "policy": "um", "gpu_budget": 2**34,
         "world_size": 1}]


def test_disabled_benchmarks_have_no_points() -> None:
    config = load("config/config.yaml", extra={"collectives": {"enabled": False},
                                               "train": {"enabled": False}})
    assert collectives_points(config) == train_points(config) == []


@pytest.mark.parametrize(("spec", "folder"), [
    (COLLECTIVES, "allreduce/numpy/ranks2/none"),  # the folders before the spec named them
    (COLLECTIVES, "allreduce/numpy/nodes2_ranks4/cores"),
    (COLLECTIVES, "allreduce/numpy/ranks=2/nodes=1/binding=none"),  # one node is implied
    (COLLECTIVES, "allreduce/numpy/ranks=02/binding=none"),
    (COLLECTIVES, "allreduce/numpy/binding=none/ranks=2"),
    (TRAIN, "transformer/125M/hpcmem/budget_none"),
    (TRAIN, "transformer/params=125M/budget=none/policy=um"),
    (TRAIN, "transformer/params=125000000/budget=4G/policy=um"),
])
def test_a_folder_of_no_point_is_refused_naming_it_and_the_form(spec: Benchmark,
                                                                folder: str) -> None:
    form = {"collectives": "<op>/<buffer>/ranks=<n>[/nodes=<n>]/binding=<binding>",
            "train": "<model>/params=<n>/budget=<n|none>/policy=<policy>[/gpus=<n>]"}[spec.name]
    with pytest.raises(FolderError) as error:
        spec.parse_folder(folder)
    assert str(error.value) == f"{spec.name} folder {folder!r} is not {form}"


def test_collectives_options_are_what_hpcmem_collectives_reads() -> None:
    point = {"op": "reduce_scatter", "buffer": "hbw_preferred", "ranks": 4, "nodes": 2,
             "binding": "cores"}  # the launcher takes ranks and nodes, hpcmem bind the binding
    options = COLLECTIVES.options(point)
    assert options == ["--op", "reduce_scatter", "--buffer", "hbw_preferred"]
    parser = argparse.ArgumentParser()
    collectives_cli.add_arguments(parser)
    args = parser.parse_args(options)
    assert (args.op, args.buffer) == ("reduce_scatter", "hbw_preferred")


@pytest.mark.parametrize(("point", "options"), [
    ({"model": "cnn", "params": 25557032, "gpu_budget": None, "policy": "um"},
     ["--model", "cnn", "--policy", "um"]),  # the model's own size: --params left out
    ({"model": "transformer", "params": 125000000, "gpu_budget": 2**34, "policy": "hpcmem"},
     ["--model", "transformer", "--gpu-budget", "17179869184", "--policy", "hpcmem"]),
    ({"model": "transformer", "params": 1300000000, "gpu_budget": None, "policy": "cuda"},
     ["--model", "transformer", "--params", "1300000000", "--policy", "cuda"]),
])
def test_train_options_give_hpcmem_train_the_point(point: dict, options: list[str]) -> None:
    point = {**point, "world_size": 1}  # one GPU: no --world-size
    assert TRAIN.options(point) == options
    given = dict(zip(options[::2], options[1::2], strict=True))
    asked = make_point(model=given["--model"], params=given.get("--params"),
                       gpu_budget=given.get("--gpu-budget"), policy=given["--policy"])
    assert (asked.params_requested or default_params(asked.model)) == point["params"]
    assert (asked.model, asked.gpu_budget, asked.policy) == (
        point["model"], point["gpu_budget"], point["policy"])


def test_a_cnn_left_at_its_size_has_one_key_skipped_or_measured() -> None:
    skipped = {"model": "cnn", "params": None, "params_requested": None, "batch": 256,
               "seq_len": None, "dtype": "fp32", "gpu_budget": None, "policy": {"name": "um"},
               "oversubscribe": None}
    ok = {**skipped, "params": 25557032}
    keys = {TRAIN.point_key(TRAIN.coordinates_of(record)) for record in (skipped, ok)}
    assert keys == {"train/cnn/params=25557032/batch=256/seq=none/fp32/budget=none/policy=um"}
