"""The one-node test cluster itself: sbatch, srun with PMIx MPI ranks, sacct, idempotent start."""

from __future__ import annotations

import sys
import time

import pytest
from slurm_cluster import SlurmCluster, cluster_command

pytestmark = pytest.mark.slurm

HELLO = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print('rank', c.Get_rank(), 'of', c.Get_size(), flush=True)"
)


def _wait_finished(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> str:
    """The final sacct state of ``job_id``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout.strip()
        if out and out not in ("PENDING", "RUNNING", "COMPLETING"):
            return out
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout}s")


def test_srun_starts_two_pmix_mpi_ranks(slurm_cluster: SlurmCluster) -> None:
    result = slurm_cluster.run("srun", "-n", "2", sys.executable, "-c", HELLO)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split("\n")[:2]) == ["rank 0 of 2", "rank 1 of 2"]


def test_sbatch_job_is_accounted_by_sacct(slurm_cluster: SlurmCluster, tmp_path) -> None:
    out = tmp_path / "job-%j.out"
    submit = slurm_cluster.run(
        "sbatch", "--parsable", "-n", "2", "-o", str(out),
        "--wrap", f"srun {sys.executable} -c \"{HELLO}\"",
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    assert _wait_finished(slurm_cluster, job_id) == "COMPLETED"
    lines = (tmp_path / f"job-{job_id}.out").read_text().split()
    assert lines.count("rank") == 2


def test_start_is_idempotent(slurm_cluster: SlurmCluster) -> None:
    before = cluster_command("status").stdout
    began = time.monotonic()
    cluster_command("start")
    assert time.monotonic() - began < 10
    assert cluster_command("status").stdout == before
    assert "idle" in before or "mixed" in before
