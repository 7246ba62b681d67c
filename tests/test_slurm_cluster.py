"""The one-node test cluster itself: sbatch, srun with PMIx MPI ranks, sacct, idempotent start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import CLUSTER_SH, SlurmCluster, cluster_command, pid_alive

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


def test_stop_after_a_half_started_start_leaves_nothing(slurm_cluster: SlurmCluster) -> None:
    # A second cluster on its own ports and state dir (MariaDB's user must reach it: not
    # under pytest's private tmp folder), interrupted as soon as MariaDB is up.
    state = slurm_cluster.state_dir / "half-started-test"
    shutil.rmtree(state, ignore_errors=True)
    env = dict(os.environ, HPCMEM_SLURM_PORT="26817", HPCMEM_SLURM_MYSQL_PORT="26306")
    start = subprocess.Popen([str(CLUSTER_SH), "start", str(state)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    pid_file = state / "mysql" / "mariadbd.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and start.poll() is None, "MariaDB did not start"
        time.sleep(0.05)
    start.kill()
    start.wait()
    pid_files = [*state.glob("run/*.pid"), pid_file]  # STATE/mysql may be a link
    try:
        pids = [int(p.read_text()) for p in pid_files if p.exists() and p.read_text().strip()]
        assert pids and all(pid_alive(pid) for pid in pids)
    finally:
        cluster_command("stop", state)
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not [p for p in pid_files if p.exists()]
    assert (state / "log" / "mariadbd.log").exists()  # logs are kept
    assert Path("/run/slurm/conf").resolve().is_relative_to(slurm_cluster.state_dir)
    assert slurm_cluster.run("sinfo", "-h", "-o", "%T").stdout.strip() in ("idle", "mixed")
    shutil.rmtree(state)
