"""The one-node test cluster itself: sbatch, srun with PMIx MPI ranks, sacct, idempotent start,
site-like accounting (partitions, account, QOS enforced), several clusters on one machine,
knobs for node CPUs, time and QOS limits (the small site), and a start that would change a
running cluster refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import (
    CLUSTER_SH,
    SITE,
    SMALL_SITE,
    SlurmCluster,
    cluster_command,
    pid_alive,
)

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


def test_the_cluster_is_site_like_and_jobs_see_their_own_cluster(
    slurm_cluster: SlurmCluster, tmp_path
) -> None:
    # srun inside the job finds the configuration without SLURM_CONF (configless, as the
    # executor plugin's job steps do), through this cluster's slurmd namespace
    script = "env -u SLURM_CONF srun -n1 readlink /run/slurm/conf"
    submit = slurm_cluster.run(
        "sbatch", "--parsable", "-p", slurm_cluster.other_partition, "--qos",
        slurm_cluster.qos, "-o", str(tmp_path / "job.out"), "--wrap", script,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip()
    assert _wait_finished(slurm_cluster, job_id) == "COMPLETED"
    conf = Path((tmp_path / "job.out").read_text().strip())
    assert conf.is_relative_to(slurm_cluster.state_dir)
    expected = f"{slurm_cluster.other_partition}|{slurm_cluster.account}|{slurm_cluster.qos}"
    deadline = time.monotonic() + 30  # slurmdbd fills in partition and QOS a moment later
    while (shown := slurm_cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o",
                                      "Partition,Account,QOS").stdout.strip()) != expected:
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)
    # accounting is enforced: an unknown QOS or an account without association is refused
    for option, error in ((("--qos", "nosuch"), "Invalid qos specification"),
                          (("-A", "nosuch"), "Invalid account")):
        refused = slurm_cluster.run("sbatch", *option, "--wrap", "true")
        assert refused.returncode != 0 and error in refused.stderr


def test_start_is_idempotent(slurm_cluster: SlurmCluster) -> None:
    before = cluster_command("status").stdout
    began = time.monotonic()
    cluster_command("start")
    assert time.monotonic() - began < 10
    assert cluster_command("status").stdout == before
    assert "idle" in before or "mixed" in before


def test_stop_after_a_half_started_start_leaves_nothing(slurm_cluster: SlurmCluster) -> None:
    # A second cluster on its own ports (next to this checkout's) and state dir (MariaDB's
    # user must reach it: not under pytest's private tmp folder), interrupted as soon as
    # MariaDB is up.
    state = slurm_cluster.state_dir / "half-started-test"
    shutil.rmtree(state, ignore_errors=True)
    port = int(os.environ.get("HPCMEM_SLURM_PORT", "16817")) + 3
    mysql_port = int(os.environ.get("HPCMEM_SLURM_MYSQL_PORT", "16306")) + 1
    env = dict(os.environ, HPCMEM_SLURM_PORT=str(port), HPCMEM_SLURM_MYSQL_PORT=str(mysql_port))
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
    # the shared munged outlives the second cluster: this one still authenticates
    assert slurm_cluster.run("sinfo", "-h", "-o", "%T").stdout.split()[0] in ("idle", "mixed")
    assert slurm_cluster.run("sacctmgr", "-n", "list", "cluster").returncode == 0
    shutil.rmtree(state)


def _start(state: Path, **settings: str) -> subprocess.CompletedProcess:
    """``cluster.sh start STATE`` with the site-like settings and ``settings`` on top."""
    return subprocess.run([str(CLUSTER_SH), "start", str(state)], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **SITE, **settings})


def test_a_start_that_would_change_a_running_cluster_refuses(
    slurm_cluster: SlurmCluster,
) -> None:
    conf = slurm_cluster.conf.read_bytes()
    other = _start(slurm_cluster.state_dir, HPCMEM_SLURM_MAX_TIME="30")
    assert other.returncode == 2, other.stderr
    assert "  HPCMEM_SLURM_MAX_TIME: running with INFINITE, asked for 30\n" in other.stderr
    assert f"cluster.sh stop {slurm_cluster.state_dir} && " in other.stderr
    assert slurm_cluster.conf.read_bytes() == conf
    # a hand edit of the running cluster's slurm.conf is not overwritten either
    slurm_cluster.conf.write_bytes(conf + b"MaxJobCount=5\n")
    try:
        edited = _start(slurm_cluster.state_dir)
        assert edited.returncode == 2, edited.stderr
        assert "  slurm.conf has:    MaxJobCount=5\n" in edited.stderr
        assert slurm_cluster.conf.read_bytes() == conf + b"MaxJobCount=5\n"
    finally:
        slurm_cluster.conf.write_bytes(conf)
    assert _start(slurm_cluster.state_dir).returncode == 0


def test_time_and_qos_knobs_make_the_cluster_a_site(small_cluster: SlurmCluster) -> None:
    # the small site: a second cluster (own ports and state dir, which MariaDB's user must
    # reach) with 2-CPU nodes, a 30-minute MaxTime, a 5-minute DefaultTime, limits on its QOS
    nodes = small_cluster.run("sinfo", "-h", "-N", "-o", "%c").stdout.split()
    assert nodes and set(nodes) == {"2"}
    partitions = small_cluster.run("scontrol", "show", "partition", "-o").stdout.splitlines()
    assert len(partitions) == 2
    assert all("MaxTime=00:30:00" in line and "DefaultTime=00:05:00" in line
               for line in partitions), partitions
    qos = small_cluster.run("sacctmgr", "-n", "-P", "show", "qos", small_cluster.qos,
                            "format=MaxWall,MaxTRESPerJob,MaxSubmitJobsPU").stdout.strip()
    assert qos == "00:20:00|cpu=1|3"
    for knob, value in (("HPCMEM_SLURM_DEFAULT_TIME", "soon"), ("HPCMEM_SLURM_CPUS", "0")):
        bad = _start(small_cluster.state_dir, **{**SMALL_SITE, knob: value})
        assert bad.returncode == 2 and f"{knob}={value}" in bad.stderr, bad.stderr
