"""Collectives across nodes on the two-node test cluster (node1 and node2, each a slurmd in
network namespaces of its own, MPI between them over TCP).

A site profile runs the sweep ``nodes: [1, 2]`` x ``tasks_per_node: [2]`` (allreduce on
NumPy buffers, ``cores`` binding) up to its benchmark jobs: the one-node point in
``ranks=2/binding=cores``, the two-node point in ``ranks=4/nodes=2/binding=cores``. While
the two-node job runs, node2 loses power (``cluster.sh node-down``: its slurmd and every
process on it killed): the job fails naming its Slurm log, and its retry (the template's
``retries: 1``) waits for nodes that are up, not refused for the lost job's node list. With
the node back, the same run redoes that point; its records say its ranks ran on node1 and
node2, two per node, each bound to its own core, and were checked against NumPy; the report
made from them draws latency and bus bandwidth against node count. Then the two-node
training point: a rank killed as it runs fails it, srun naming the task and its node; the
rerun redoes that point alone.

To keep the module short (its Slurm jobs wait on the executor's status polls): the wheel
and the run's environment are built beforehand with the local profile, from the checkout
itself (reusing its native build), and the Slurm runs stop after the benchmark jobs
(aggregate, check and report on Slurm are test_slurm_workflow.py's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import CLUSTER_SH, SlurmCluster
from slurm_site import BIN, ONE_JOB_PER_POINT, REPO, run_logged, site_profile

from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

pytestmark = [pytest.mark.slurm, pytest.mark.multinode]

RUN_ID = "mn"
#: the two-node point times for about a second on an idle machine (its 4 ranks share the
#: 2 cores, so they yield when idle), long enough to lose a node in the middle of it; beside
#: a booted guest it takes a hundred times as long, which the rerun's time limit must allow
SWEEP = {
    "container": {"enabled": False},
    "collectives": {
        "nodes": [1, 2], "tasks_per_node": [2], "ops": ["allreduce"],
        "buffers": ["numpy"], "bindings": ["cores"], "emulate_hbw": None,
        "min_size": 8, "max_size": 32, "iterations": 2000, "warmup": 5, "repeats": 1,
        "yield_when_idle": True,
    },
    # one data-parallel training point over both nodes, one rank each, on their CPUs
    # (gloo, the cuda policy's allocator): a tiny fp32 model, 2 steps; no GPU is asked for
    "train": {
        "models": ["transformer"], "params": ["1M"], "policies": ["cuda"],
        "gpu_budgets": ["none"], "nodes": [2], "gpus_per_node": [1], "device": "cpu",
        "batch": 4, "seq_len": 32, "vocab": 256, "dtype": "fp32", "steps": 2, "warmup": 1,
    },
}  # fmt: skip
SIZES = [8, 16, 32]
TRAIN_POINT = "transformer/params=1000000/budget=none/policy=cuda/gpus=2"
ONE_NODE, TWO_NODES = "ranks=2", "ranks=4/nodes=2"


@dataclass
class Sweep:
    """The working directory and the site profile of the two-node cluster."""

    cluster: SlurmCluster
    workdir: Path
    profile: Path

    def command(self, profile: Path | None = None, until: str = "run_collectives"
                ) -> list[str]:
        return [str(BIN / "snakemake"), "--profile", str(profile or self.profile),
                "--snakefile", str(REPO / "workflow" / "Snakefile"),
                "--directory", str(self.workdir), "--config", f"run_id={RUN_ID}",
                "--until", until]

    def records(self, layout: str) -> Path:
        return self.workdir / "results" / RUN_ID / "collectives" / "allreduce" / "numpy" \
            / layout / "binding=cores.jsonl"


def _has_header(text: Path) -> bool:
    try:
        return "# OSU MPI" in text.read_text()
    except FileNotFoundError:  # the point ended and moved its file in place meanwhile
        return False


def node_down_while_running(sweep: Sweep, process: subprocess.Popen) -> str:
    """Once the two-node job's ranks are timing (rank 0 has written the OSU header to the
    job's own text file), power node2 off; the job's id. Waiting for the header, not for a
    fixed time, loses the node mid-point however fast or slow the ranks run."""
    osu = sweep.records(TWO_NODES).with_suffix(".osu.txt")
    job_id = None
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run ended first:\n{process.communicate()[0]}")
        if job_id is None:
            jobs = sweep.cluster.run("squeue", "-h", "-o", "%i|%N").stdout.split()
            job_id = next((job.split("|")[0] for job in jobs if job.endswith("|node[1-2]")),
                          None)
        elif any(_has_header(text) for text in osu.parent.glob(f"{osu.name}.*.tmp")):
            down = subprocess.run([str(CLUSTER_SH), "node-down", str(sweep.cluster.state_dir),
                                   "node2"], capture_output=True, text=True, timeout=60)
            assert down.returncode == 0, down.stderr
            return job_id
        time.sleep(0.05)
    raise AssertionError("the two-node job never ran")


@pytest.fixture(scope="module")
def sweep(multinode_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    work = tmp_path_factory.mktemp("multinode")
    (work / "work" / "config").mkdir(parents=True)
    for name in ("config.yaml", "references.yaml"):
        (work / "work" / "config" / name).write_text(
            (REPO / ".test" / "config" / name).read_text())
    # 5 minutes a point, not the template's 1: on two cores shared with other work the
    # two-node point's 4 yielding ranks ran past a minute and Slurm ended the job (TIMEOUT)
    profile = site_profile(work / "site-profile", multinode_cluster, SWEEP, **ONE_JOB_PER_POINT,
                           retries=1, **{"set-resources.run_collectives.runtime": 5})
    sweep = Sweep(multinode_cluster, work / "work", profile)
    local = sweep.command(REPO / "profiles" / "local", until="install_wheel")
    built = subprocess.run([*local, "--configfile", str(profile / "sweep.yaml")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           cwd=sweep.workdir, timeout=300)
    assert built.returncode == 0, built.stdout
    return sweep


def _retried(sweep: Sweep, job_id: str, process: subprocess.Popen) -> str:
    """Until the lost two-node job's retry is queued (a job of two nodes besides it): its id."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run ended first:\n{process.communicate()[0]}")
        queued = sweep.cluster.run("squeue", "-h", "-o", "%i|%D").stdout.split()
        retry = next((job.split("|")[0] for job in queued
                      if job.endswith("|2") and job.split("|")[0] != job_id), None)
        if retry is not None:
            return retry
        time.sleep(0.5)
    raise AssertionError(f"job {job_id}'s point was never submitted again")


@pytest.fixture(scope="module")
def lost_node(sweep: Sweep) -> dict[str, Any]:
    """The sweep, node2 powered off under its two-node job, then back once the point's
    retry is queued; the run to its end. The two-node point is submitted first, so the node
    is lost while the one-node point waits for it."""
    first = ("--prioritize", str(sweep.records(TWO_NODES).relative_to(sweep.workdir)))
    process = subprocess.Popen(sweep.cluster.on_login([*sweep.command(), *first]),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=sweep.workdir,
                               env={**sweep.cluster.env(), "PATH": f"{BIN}:{os.environ['PATH']}"},
                               start_new_session=True)
    try:
        try:
            job_id = node_down_while_running(sweep, process)
            retry = _retried(sweep, job_id, process)
        finally:
            up = subprocess.run([str(CLUSTER_SH), "node-up", str(sweep.cluster.state_dir),
                                 "node2"], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    states = {job: sweep.cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o",
                                     "State,NodeList").stdout.strip() for job in (job_id, retry)}
    return {"rc": process.returncode, "output": output, "job_id": job_id, "retry": retry,
            "states": states}


def test_losing_a_node_fails_the_job_naming_its_log_and_the_retry_redoes_it(
        sweep: Sweep, lost_node: dict) -> None:
    output, job_id, retry = lost_node["output"], lost_node["job_id"], lost_node["retry"]
    assert lost_node["rc"] == 0, output
    assert lost_node["states"] == {job_id: "NODE_FAIL|node[1-2]", retry: "COMPLETED|node[1-2]"}
    assert f"SLURM-job '{job_id}' failed due to a node failure" in output, output
    assert "hpcmem: a job lost a node of node[1-2]: its retry runs on nodes Slurm has up" \
        in output
    assert "--exclude" not in output
    log = re.escape(f"/{TWO_NODES}/binding=cores.log")  # named as the point's folder
    logs = re.search(rf"log: (\S+{log}), (\S+/{job_id}\.log)", output)
    assert logs, output
    assert "node failure" in Path(logs[2]).read_text().lower()
    # the lost job restarted once, and nothing else
    assert len(re.findall(r"^Trying to restart job \d+\.$", output, re.MULTILINE)) == 1


def per_host(records: list[dict]) -> dict[str, list[dict]]:
    ranks = records[0]["binding"]["per_rank"]
    hosts: dict[str, list[dict]] = {}
    for rank in ranks:
        hosts.setdefault(rank["host"], []).append(rank)
    return hosts


@pytest.mark.parametrize(("layout", "nodes"), [(ONE_NODE, 1), (TWO_NODES, 2)])
def test_records_say_where_each_rank_ran(sweep: Sweep, lost_node: dict, layout: str,
                                         nodes: int) -> None:
    records = read_records(sweep.records(layout))
    assert [validate_record(r) for r in records] == [[]] * len(SIZES)
    assert sorted(r["size_bytes"] for r in records) == SIZES
    # every size was checked against the NumPy reference before and after timing
    assert {(r["status"], r["validated"]) for r in records} == {("ok", True)}
    assert {(r["nodes"], r["tasks_per_node"], r["ranks"]) for r in records} == {
        (nodes, 2, 2 * nodes)}
    hosts = per_host(records)
    expected = ["node1", "node2"][:nodes]
    assert sorted(hosts) == expected and all(r["hosts"] == expected for r in records)
    for ranks in hosts.values():  # on each node its own local ranks, each on its own core
        assert sorted(r["local_rank"] for r in ranks) == [0, 1]
        assert sorted(r["cpus"] for r in ranks) == [[0], [1]]
        assert {r["mempolicy"]["mode"] for r in ranks} == {"local"}
    assert all(sorted(r["placement"]["hosts"]) == expected for r in records)
    (job_id,) = {r["slurm_job_id"] for r in records}
    shown = sweep.cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "NNodes,State")
    assert shown.stdout.strip() == f"{nodes}|COMPLETED"


def _report(records: Path, folder: Path) -> str:
    """``hpcmem aggregate`` of ``records``, then ``hpcmem report`` of it, in ``folder``: the
    report's HTML."""
    hpcmem = str(BIN / "hpcmem")
    for command in ([hpcmem, "aggregate", "--out", str(folder / "summary"), str(records)],
                    [hpcmem, "report", str(folder / "summary"), "--out",
                     str(folder / "report.html")]):
        made = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
    return (folder / "report.html").read_text()


def test_the_report_draws_scaling_curves(sweep: Sweep, lost_node: dict, tmp_path: Path
                                         ) -> None:
    report = _report(sweep.workdir / "results" / RUN_ID / "collectives", tmp_path)
    assert "Scaling with node count" in report
    assert 'alt="allreduce latency and bus bandwidth against node count (numpy, cores, 2 ' \
        'ranks per node)"' in report


def _kill_rank(process: subprocess.Popen, rank: int) -> None:
    """Once training rank ``rank`` runs (a task of the job's first step with that
    SLURM_PROCID), kill it."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run ended first:\n{process.communicate()[0]}")
        found = subprocess.run(["pgrep", "-f", "hpcmem train"], capture_output=True, text=True)
        for pid in found.stdout.split():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile
                continue
            if f"SLURM_PROCID={rank}".encode() in environ and b"SLURM_STEP_ID=0" in environ:
                os.kill(int(pid), signal.SIGKILL)
                return
        time.sleep(0.05)
    raise AssertionError(f"training rank {rank} never ran")


@pytest.fixture(scope="module")
def killed_rank(sweep: Sweep, lost_node: dict) -> dict[str, Any]:
    """The sweep's training point, its rank 1 (on node2) killed as it runs, not retried
    (``--retries 0``): the rerun is the next run."""
    command = [*sweep.command(until="run_train_ranks"), "--retries", "0"]
    process = subprocess.Popen(sweep.cluster.on_login(command),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=sweep.workdir,
                               env={**sweep.cluster.env(), "PATH": f"{BIN}:{os.environ['PATH']}"},
                               start_new_session=True)
    try:
        _kill_rank(process, 1)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return {"rc": process.returncode, "output": output}


def test_a_killed_rank_fails_its_point_naming_the_task_and_node(sweep: Sweep,
                                                                killed_rank: dict) -> None:
    output = killed_rank["output"]
    assert killed_rank["rc"] == 1, output
    assert "srun: error: node2: task 1: Killed" in output, output
    assert not (sweep.workdir / "results" / RUN_ID / "train" / f"{TRAIN_POINT}.jsonl").exists()


@pytest.fixture(scope="module")
def trained(sweep: Sweep, killed_rank: dict) -> subprocess.CompletedProcess:
    """The sweep's training point again, after the run whose rank was killed."""
    return run_logged(sweep.command(until="run_train_ranks"), sweep.cluster, cwd=sweep.workdir,
                      timeout=600)


def test_a_two_node_training_point_writes_one_merged_record(sweep: Sweep, trained) -> None:
    output = trained.stdout
    assert trained.returncode == 0, output
    # the rerun redoes the killed point alone
    assert re.findall(r"^rule (\w+):", output, re.MULTILINE) == ["run_train_ranks"], output
    assert re.search(r"srun --nodes=2 --ntasks-per-node=1 --ntasks=2 --kill-on-bad-exit=1 "
                     r"\S+/hpcmem train "
                     r".*--world-size 2", output), output
    path = sweep.workdir / "results" / RUN_ID / "train" / f"{TRAIN_POINT}.jsonl"
    [record] = read_records(path)
    assert validate_record(record) == []
    assert (record["status"], record["world_size"], record["batch"]) == ("ok", 2, 4)
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert sorted(r["host"] for r in record["ranks"]) == ["node1", "node2"]
    assert {r["status"] for r in record["ranks"]} == {"ok"}
    job_id = record.get("slurm_job_id")
    if job_id:
        shown = sweep.cluster.run("sacct", "-n", "-X", "-P", "-j", str(job_id),
                                  "-o", "NNodes,State")
        assert shown.stdout.strip() == "2|COMPLETED"


def test_the_report_shows_the_training_point(sweep: Sweep, trained, tmp_path: Path) -> None:
    report = _report(sweep.workdir / "results" / RUN_ID / "train", tmp_path)
    text = " ".join(re.sub(r"<[^>]+>", " ", report).split())
    # the point's row of the step-time table (its GPU count is its key's; the table has no
    # column of it yet), and its record counted as ok
    assert "Training with Unified Memory" in text
    assert "transformer 1000000 4 32 fp32 1 - False float32 cuda" in text
    assert "1 ok, 0 failed, 0 skipped" in text
