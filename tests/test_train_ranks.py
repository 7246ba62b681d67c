"""``hpcmem train`` data-parallel on CPUs: ranks started by a real ``torchrun`` (gloo, the
``cuda`` policy's plain allocator on the CPU, ``DistributedDataParallel``) train as one
process on the same global batch, rank 0 writes one record merged from every rank's, and a
world size that does not divide the batch is refused before any rank starts.

Tolerance (fp32): the ranks average their gradients (each over its rows) where one process takes
the mean over all rows; the sums run in another order, so the losses agree to 1e-5
relative over three steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAUNCH, rank_environment, torchrun

from hpcmem.cli import main

TINY = ["--device", "cpu", "--policy", "cuda", "--params", "1M", "--vocab", "256",
        "--seq-len", "32", "--batch", "4", "--accumulate", "2", "--steps", "2",
        "--warmup", "1", "--dtype", "fp32"]


def _train(tmp_path: Path, name: str, ranks: int) -> dict:
    """``hpcmem train`` in one process (``ranks`` 1) or as ``ranks`` ranks of torchrun."""
    out = tmp_path / f"{name}.jsonl"
    command = ["-m", "hpcmem", "train", *TINY, "--output", str(out)]
    done = (torchrun(ranks, *command) if ranks > 1 else
            subprocess.run([sys.executable, *command], env=rank_environment(),
                           capture_output=True, text=True, timeout=240))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("hpcmem train:") == 1  # rank 0 alone says it
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    return record


def test_two_ranks_train_as_one_process_and_write_one_merged_record(tmp_path):
    one = _train(tmp_path, "one", 1)
    two = _train(tmp_path, "two", 2)
    assert (one["world_size"], two["world_size"]) == (1, 2) and "ranks" not in one
    assert two["batch"] == one["batch"] == 4  # the global micro-batch
    for end in ("first", "last"):
        assert two["losses"][end] == pytest.approx(one["losses"][end], rel=1e-5)
    ranks = two["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["status"] for r in ranks} == {"ok"}
    assert all(r["host_peak_bytes"] > 0 for r in ranks)
    assert len(two["step_ms_all"]) == 3
    assert two["step_ms"]["median"] >= max(r["step_ms"] for r in ranks) - 1e-9
    assert two["throughput_unit"] == "tokens/s" and two["throughput"] > 0


def test_a_world_size_that_does_not_divide_the_batch_is_refused(monkeypatch, capsys, tmp_path):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "train.jsonl"
    assert main(["train", *TINY, "--world-size", "3", "--output", str(out)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["hpcmem train: error: --batch: 4 samples do not split evenly between 3 "
                    "ranks (--world-size); accepted: a multiple of 3"]
    assert not out.exists()


def test_world_size_without_ranks_started_is_refused(monkeypatch, capsys):
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    assert main(["train", *TINY, "--world-size", "2"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("hpcmem train: error: --world-size 2: no ranks were started")
