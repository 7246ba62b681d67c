"""benchmarks/osu_comparison.py: OSU's C binaries and hpcmem side by side, for real.

The run against OSU needs an OSU install: HPCMEM_OSU_DIR (``make test`` builds one from the
OSU tarball HPCMEM_OSU_TARBALL names into ~/.cache/hpcmem/osu-7.4); without it that test is
skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, mpi_environment

from hpcmem.cli import main
from hpcmem.collectives.comparison import COMPARED_OPS, OsuDirError, find_binaries
from hpcmem.results.aggregate import aggregate

SCRIPT = REPO / "benchmarks" / "osu_comparison.py"
FIXTURES = Path(__file__).parent / "fixtures" / "records"


def _osu_dir() -> str:
    where = os.environ.get("HPCMEM_OSU_DIR")
    if not where:
        pytest.skip("no OSU install: set HPCMEM_OSU_DIR "
                    "(make test builds one from HPCMEM_OSU_TARBALL)")
    try:
        find_binaries(where)
    except OsuDirError as error:
        pytest.skip(f"HPCMEM_OSU_DIR holds no OSU build ({error})")
    return where


def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          env=mpi_environment(), cwd=REPO, timeout=300)


@pytest.mark.parametrize("where", ["/nonexistent/osu", "."])
def test_bad_osu_dir_is_one_line_naming_what_is_missing(where, tmp_path):
    result = _script("--osu-dir", where, "--out-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("osu_comparison.py: error: --osu-dir: ")
    assert ("is not a folder" if where.startswith("/") else "has no executable osu_allreduce") \
        in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mpi
def test_osu_and_both_hpcmem_loops_side_by_side(tmp_path):
    osu_dir = _osu_dir()
    result = _script("--osu-dir", osu_dir, "--rounds", "2", "--max-size", "16",
                     "--out-dir", str(tmp_path))
    assert result.returncode in (0, 1), result.stderr  # 1: a target missed on a busy machine
    (json_file,) = tmp_path.glob("osu_comparison-*.json")
    comparison = json.loads(json_file.read_text())
    assert comparison["rounds"] == 2 and comparison["osu"]["version"]
    # the record names no folder of this machine: the temporary one is <tmp>
    out_dir = tmp_path.relative_to(tempfile.gettempdir())
    assert comparison["command"].endswith(f"--rounds 2 --max-size 16 --out-dir <tmp>/{out_dir}")
    assert [(r["op"], r["size_bytes"]) for r in comparison["rows"]] == [
        (op, size) for op in COMPARED_OPS for size in (8, 16)]
    for row in comparison["rows"]:
        for method in ("osu", "mpi4py", "native"):
            assert len(row["rounds"][method]) == 2 and min(row["rounds"][method]) > 0, row
        assert row["mpi4py_ratio"] == pytest.approx(row["mpi4py_us"] / row["osu_us"])
        assert set(row["targets"]) == ({"native", "mpi4py"} if row["size_bytes"] == 8
                                       else {"native"})
    markdown = json_file.with_suffix(".md").read_text()
    assert f"`{comparison['command']}`" in markdown and "trial: fewer than 15 rounds" in markdown
    assert markdown.count("\n| allreduce |") == 2

    aggregate([FIXTURES / "collectives"], tmp_path / "summary")
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "summary"), "--osu", str(json_file),
                 "--out", str(page)]) == 0
    text = page.read_text()
    assert "Against OSU C" in text and "native / C" in text and comparison["commit"] in text


def test_report_rejects_a_file_that_is_no_comparison(tmp_path, capsys):
    aggregate([FIXTURES / "collectives"], tmp_path / "summary")
    (tmp_path / "other.json").write_text('{"date": "today"}')
    assert main(["report", str(tmp_path / "summary"), "--osu", str(tmp_path / "other.json"),
                 "--out", str(tmp_path / "r.html")]) == 2
    error = capsys.readouterr().err
    assert "--osu: " in error and "not an OSU comparison (no command, commit" in error
    assert not (tmp_path / "r.html").exists()
