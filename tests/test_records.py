"""The fields every record carries, the commit it names, and the one JSONL reader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hpcmem.record.jsonl import read_lines, read_records
from hpcmem.record.provenance import common_fields, git_sha
from hpcmem.train.spec import TRAIN

REPO = Path(__file__).resolve().parents[1]
HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                      check=True).stdout.strip()


def test_the_commit_of_a_checkout_or_the_one_passed_in(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HPCMEM_GIT_SHA", raising=False)
    git_sha.cache_clear()
    assert git_sha() == HEAD  # the checkout hpcmem is imported from
    assert git_sha(tmp_path) is None  # no checkout, nothing passed in
    monkeypatch.setenv("HPCMEM_GIT_SHA", "0123abc")
    git_sha.cache_clear()
    assert git_sha(tmp_path) == git_sha() == "0123abc"
    git_sha.cache_clear()


def test_a_record_made_outside_a_checkout_names_the_commit_passed_in(tmp_path: Path) -> None:
    """hpcmem copied out of the checkout, as an installed wheel is: only HPCMEM_GIT_SHA can say
    which commit it is (``-S`` keeps the editable install's import hook out)."""
    shutil.copytree(REPO / "hpcmem", tmp_path / "installed" / "hpcmem",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    site = sysconfig.get_paths()["purelib"]
    code = ("import json; from hpcmem.record.provenance import common_fields; "
            "from hpcmem.collectives.spec import COLLECTIVES; "
            "print(json.dumps(common_fields(COLLECTIVES, binding={})['git_sha']))")
    env = {"PYTHONPATH": f"{tmp_path / 'installed'}{os.pathsep}{site}"}
    for passed, expected in ((HEAD, HEAD), (None, None)):
        run_env = env if passed is None else {**env, "HPCMEM_GIT_SHA": passed}
        done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True,
                              text=True, env=run_env, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == expected


def test_common_fields_name_their_benchmark_and_refuse_an_unknown_status() -> None:
    assert common_fields(TRAIN, binding={})["benchmark"] == "train"
    with pytest.raises(ValueError, match="status 'done' is not one of ok, failed, skipped"):
        common_fields(TRAIN, binding={}, status="done")


def test_read_lines_and_read_records(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"b": 2}\n{"c": \n')
    assert [(n, r) for n, r, _ in read_lines(path)] == [(1, {"a": 1}), (3, {"b": 2}), (4, None)]
    assert list(read_lines(path))[-1][2].startswith("not a JSON record (")
    with pytest.raises(ValueError, match=r"r\.jsonl:4: not a JSON record"):
        read_records(path)
    path.write_text('{"a": 1}\n{"b": 2}\n')
    assert read_records(path) == [{"a": 1}, {"b": 2}]
