"""``hpcmem collectives --output`` that rank 0 cannot write: every rank stops, none hangs."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.mpi

QUICK = ["--op", "allreduce", "--min-size", "8", "--max-size", "64", "--iterations", "2",
         "--warmup", "1"]


@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_unusable_output_stops_every_rank_before_measuring(mpirun, tmp_path, where):
    (tmp_path / "file").write_text("x")
    output = tmp_path if where == "folder" else tmp_path / "file" / "r.jsonl"
    started = time.monotonic()
    result = mpirun(2, "hpcmem", "collectives", *QUICK, "--output", str(output), timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr
    assert "# OSU" not in result.stdout  # nothing measured
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"hpcmem collectives: error: --output: {output}: "
                      + ("is a folder, not a file" if where == "folder"
                         else f"{tmp_path / 'file'} is a file, not a folder")]
    assert "Traceback" not in result.stderr


def test_output_failing_after_measuring_stops_every_rank(mpirun, tmp_path):
    output = tmp_path / "r.jsonl"
    started = time.monotonic()
    # rank 0 may write files of 1 KiB at most: a disk that fills while the run measures
    limited = ('if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then ulimit -f 2; fi; '
               'exec hpcmem collectives "$@"')
    result = mpirun(2, "sh", "-c", limited, "sh", *QUICK, "--output", str(output), timeout=60,
                    env={"OMPI_MCA_btl": "self,tcp"})
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr
    assert "# OSU MPI Allreduce" in result.stdout  # measured, then the write failed
    assert f"hpcmem collectives: error: --output: {output}: cannot write (File too large)" \
        in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no half-written file, no temporary left
