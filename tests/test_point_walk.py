"""A point of each benchmark walked from config to verdict with one key: the folder its job
writes (the points module, as the workflow asks for it), the key of its summary row (a real
``hpcmem aggregate``) and the figure of its verdict row (a real ``hpcmem check``) all come
from its spec's one declaration. The collectives point runs for real under ``mpirun -n 2``
behind ``hpcmem bind`` with a custom binding; the training point for real on the CPU."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
import yaml
from conftest import mpi_environment
from workflow_configs import load

from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.record.jsonl import read_records
from hpcmem.record.spec import Benchmark
from hpcmem.train.spec import TRAIN
from hpcmem.workflow.commands import collectives_command, run_env, train_command
from hpcmem.workflow.outcome import RegressionFoundError, report_verdict
from hpcmem.workflow.points import collectives_points, train_points

pytestmark = pytest.mark.mpi

#: the workflow tests' sweep cut to one tiny point of each benchmark
SWEEP = {
    "run_id": "walk",
    "collectives": {"ops": ["allreduce"], "buffers": ["numpy"], "bindings": ["node0"],
                    "custom_bindings": {"node0": "--membind=0"}, "max_size": 16,
                    "iterations": 20, "warmup": 2, "repeats": 3},
    "train": {"params": ["1M"], "policies": ["cuda"], "steps": 2, "warmup": 1},
}
#: what only a test adds to the workflow's training command: the CPU, and a tiny model
ON_THE_CPU = ["--device", "cpu", "--vocab", "256", "--seq-len", "32", "--batch", "2"]
#: the figure each benchmark checks first
METRIC = {"collectives": "latency_us.avg", "train": "step_ms.median"}
#: key parts of the coordinates a job measures or derives itself (dtype and size; batch,
#: sequence length and dtype), never left out of a key
MEASURED_PARTS = {"collectives": 2, "train": 3}


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory, hpcmem_exe: str) -> dict:
    """Both points run, aggregated and checked: their folders, summary and verdict."""
    work = tmp_path_factory.mktemp("walk")
    config = load("config/config.yaml", ".test/config/config.yaml", extra=SWEEP)
    env = {**mpi_environment(), **dict(word.split("=", 1) for word in run_env(config, ""))}
    (collectives,), (train,) = collectives_points(config), train_points(config)
    folders = {"collectives": COLLECTIVES.folder(collectives), "train": TRAIN.folder(train)}
    records = {name: work / name / f"{folder}.jsonl" for name, folder in folders.items()}
    launch = ["mpirun", "-n", str(collectives["ranks"])]
    jobs = [subprocess.Popen(words, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for words in (  # both at once: a few seconds in all
        [*launch, *collectives_command(config, collectives, str(records["collectives"]),
                                       hpcmem_exe)],
        [*train_command(config, train, str(records["train"]), hpcmem_exe), *ON_THE_CPU])]
    for job in jobs:
        output, _ = job.communicate(timeout=120)
        assert job.returncode == 0, output
    summary = work / "summary"
    hpcmem = lambda *args: subprocess.run([hpcmem_exe, *args], env=env,  # noqa: E731
                                          capture_output=True, text=True, timeout=120)
    ran = hpcmem("aggregate", *map(str, records.values()), "--out", str(summary))
    assert ran.returncode == 0, ran.stderr
    points = pd.read_parquet(summary / "summary.parquet")
    keys = {name: list(points.loc[points["benchmark"] == name, "point"]) for name in folders}
    references = work / "references.yaml"  # exact figures: a name that no figure has fails
    references.write_text(yaml.safe_dump({"references": {"*:*": {
        f"{key}/{METRIC[name]}": [1000000, -1.0, 0.0, "us" if name == "collectives" else "ms"]
        for name in keys for key in keys[name]}}}))
    verdict = work / "verdict.json"
    ran = hpcmem("check", str(summary), "--references", str(references), "--history",
                 str(work / "history"), "--verdict-out", str(verdict), "--no-append",
                 "--table-out", str(work / "verdict.txt"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return {"folders": folders, "records": records, "keys": keys, "work": work,
            "verdict": verdict, "figures": json.loads(verdict.read_text())["figures"]}


@pytest.mark.parametrize("spec", [COLLECTIVES, TRAIN], ids=lambda spec: spec.name)
def test_folder_summary_key_and_verdict_row_name_one_point(walked: dict, spec: Benchmark):
    folder = walked["folders"][spec.name].split("/")
    keys = walked["keys"][spec.name]
    assert keys, f"no {spec.name} point in the summary"
    for key in keys:
        parts = key.split("/")
        assert parts[0] == spec.name
        assert [part for part in parts[1:] if part in folder] == folder  # in key order
        assert len(parts) == 1 + len(folder) + MEASURED_PARTS[spec.name]
        rows = [row for row in walked["figures"] if row["figure"] == f"{key}/{METRIC[spec.name]}"]
        assert [row["verdict"] for row in rows] == ["PASS"], walked["figures"]


def test_the_walked_points_are_the_expected_ones(walked: dict):
    assert walked["folders"] == {
        "collectives": "allreduce/numpy/ranks=2/binding=node0",
        "train": "transformer/params=1000000/budget=none/policy=cuda"}
    assert walked["keys"] == {
        "collectives": [f"collectives/allreduce/numpy/float32/ranks=2/binding=node0/size={size}"
                        for size in (8, 16)],
        "train": ["train/transformer/params=1000000/batch=2/seq=32/bf16/budget=none/policy=cuda"]}
    (record, *_) = read_records(walked["records"]["collectives"])
    assert record["binding"]["name"] == "node0"  # `hpcmem bind --name`, from the workflow


def test_the_run_ends_saying_the_verdict_and_fails_on_a_regression(walked: dict, capsys):
    status, work = walked["work"] / "exit_status", walked["work"]
    status.write_text("0\n")
    where = {"verdict_json": str(walked["verdict"]), "table": str(work / "verdict.txt"),
             "report": str(work / "report.html"), "status": str(status), "run_id": "walk"}
    report_verdict(**where, fail_on_regression=True)
    printed = capsys.readouterr().out
    assert "hpcmem: PASS: " in printed and "(system " in printed and "run walk)" in printed
    assert f"hpcmem: verdict {work / 'verdict.txt'} (every figure)" in printed
    status.write_text("1\n")
    report_verdict(**where, fail_on_regression=False)
    with pytest.raises(RegressionFoundError,
                       match=f"regression in run walk: see {work}/verdict.txt"):
        report_verdict(**where, fail_on_regression=True)
