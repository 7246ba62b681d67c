"""The workflow on the site-like test cluster, as a cluster admin runs it the first time
(docs/slurm-site.md): a site profile outside the checkout, `hpcmem preflight` clean, the
sweep (collectives in partition hbm, everything else in batch, account hpc, QOS bench, as
sacct shows), the nightly and its report.

The sweep (allreduce on numpy and emulated-HBW buffers, bindings cores and hbw, 2 ranks
under srun with PMIx) runs through sbatch, one job per point (the template's groups of
points removed; test_slurm_groups.py runs them grouped): build, install, collectives,
training (skipped without a GPU), aggregate, check, report. When one benchmark job is left,
it is cancelled with scancel: the job fails, not retried, the run ends listing its point
unfinished, and the rerun the workflow prints redoes that point alone; the report it draws
lists every Slurm job of the run with its points as sacct shows it (partition, account, QOS,
state, elapsed time, exit code). A point whose binding cannot be applied fails naming its
Slurm log. The verdict is judged for the partition the benchmarks ran in (hbm), not the
check job's. The nightly keeps its own history; SIGTERM to it mid-sweep ends it within a
minute (exit 2, verdict `could not run`, no job queued, no lock) and the next nightly runs.

The workflow runs from this checkout, set up as `make setup` leaves it (its native build
reused by the build job), as a cluster runs one checkout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from influxdb_server import InfluxDB
from slurm_cluster import SlurmCluster
from slurm_site import (
    BIN,
    ONE_JOB_PER_POINT,
    REPO,
    drawn_jobs,
    run_logged,
    site_profile,
    submitted_from,
)

from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

pytestmark = pytest.mark.slurm

RUN = Path("results", "e2e")
POINTS = [(buffer, binding) for buffer in ("numpy", "hbw") for binding in ("cores", "hbw")]
TRAIN = Path("train", "transformer", "params=125000000", "budget=none", "policy=hpcmem.jsonl")
#: benchmark points of the sweep: the collectives points and one training point
ALL_POINTS = len(POINTS) + 1
#: the site's sweep: every point runs for a few seconds, long enough to be cancelled
SWEEP = {
    "container": {"enabled": False},
    "collectives": {
        "ops": ["allreduce"],
        "buffers": ["numpy", "hbw"],
        "tasks_per_node": [2],
        "bindings": ["cores", "hbw"],
        "emulate_hbw": "0",
        "min_size": 8,
        "max_size": 64,
        "iterations": 20000,
        "warmup": 10,
    },
    "train": {"models": ["transformer"], "params": ["125M"], "policies": ["hpcmem"],
              "gpu_budgets": ["none"], "steps": 2, "warmup": 1},
}  # fmt: skip
#: the message sizes of SWEEP: 8 to 64 bytes
SIZES = (8, 16, 32, 64)
#: a point whose numactl binding names a node that does not exist: its job fails
FAILING = 'collectives={bindings: [cores, hbw, nowhere], custom_bindings: {nowhere: "--membind=7"}}'
#: what the SIGTERM'd nightly adds to the sweep: two more points
MORE = {"collectives": {"bindings": ["cores", "hbw", "none"]}}
#: benchmark rules: one job per point
BENCHMARKS = ("run_collectives", "run_train")


@dataclass
class Workflow:
    """A working directory and the site profile outside the tree."""

    cluster: SlurmCluster
    workdir: Path
    profile: Path
    #: when the first job could have been submitted (sacct's -S)
    began: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    def command(self, *extra: str) -> list[str]:
        return [
            str(BIN / "snakemake"), "--profile", str(self.profile),
            "--snakefile", str(REPO / "workflow" / "Snakefile"),
            "--directory", str(self.workdir), *extra,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = self.cluster.env()
        env["PATH"] = f"{BIN}:{env['PATH']}"
        return env

    def start(self, command: list[str], **extra_env: str) -> subprocess.Popen:
        """``command`` in a session of its own (as Slurm signals a job's processes)."""
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**self.env(), **extra_env}, cwd=self.workdir,
                                start_new_session=True)  # fmt: skip

    def run(self, *extra: str) -> subprocess.CompletedProcess:
        return run_logged(self.command(*extra), self.cluster, cwd=self.workdir)

    def point(self, buffer: str, binding: str) -> Path:
        return self.workdir / RUN / "collectives" / "allreduce" / buffer / "ranks=2" / (
            f"binding={binding}")

    def records(self) -> list[Path]:
        """Record files of finished benchmark points."""
        return sorted(path for kind in ("collectives", "train")
                      for path in (self.workdir / RUN / kind).glob("**/*.jsonl"))

    def nightly_env(self) -> dict[str, str]:
        return {"HPCMEM_PROFILE": str(self.profile), "HPCMEM_WORKDIR": str(self.workdir),
                "HPCMEM_RUN_ID": "e2e"}

    def nightly(self, *extra: str, **env: str) -> subprocess.CompletedProcess:
        """tools/nightly.sh on the site profile, for run e2e, with ``env`` on top."""
        return subprocess.run([str(REPO / "tools" / "nightly.sh"), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**self.env(), **self.nightly_env(), **env}, timeout=300)


def fingerprint(paths: list[Path]) -> dict[Path, tuple[int, str]]:
    """mtime and sha256 of each file."""
    return {p: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths}


def benchmark_jobs(cluster: SlurmCluster) -> list[tuple[str, str, str]]:
    """``(job id, state, comment)`` of the queued benchmark jobs."""
    queued = cluster.run("squeue", "-h", "-o", "%i|%T|%k").stdout.splitlines()
    jobs = [tuple(line.split("|", 2)) for line in queued]
    return [job for job in jobs if job[2].startswith(tuple(f"rule_{r}" for r in BENCHMARKS))]


def wait_for(condition, what: str, process: subprocess.Popen, timeout: float = 240):
    """Poll ``condition`` until it returns something; fail when ``process`` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ended before {what}:\n{process.communicate()[0]}")
        if found := condition():
            return found
        time.sleep(0.3)
    raise AssertionError(f"no {what} within {timeout}s")


def interrupt_when(process: subprocess.Popen, condition, what: str, interrupt
                   ) -> tuple[Any, str, float]:
    """Wait for ``condition`` while ``process`` runs, call ``interrupt`` with what it
    returned, and wait for the process to end: (found, its output, seconds it took)."""
    try:
        found = wait_for(condition, what, process)
        interrupt(found)
        began = time.monotonic()
        output, _ = process.communicate(timeout=120)
        return found, output, time.monotonic() - began
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@pytest.fixture(scope="module")
def flow(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    """The working directory (the default configuration, run_id e2e) and the site profile."""
    work = tmp_path_factory.mktemp("slurm-workflow")
    (work / "work").mkdir()
    (work / "work" / "config").mkdir()
    for name in ("config.yaml", "references.yaml"):
        (work / "work" / "config" / name).write_text((REPO / ".test" / "config" / name)
                                                     .read_text())
    profile = site_profile(work / "site-profile", slurm_cluster, SWEEP, **ONE_JOB_PER_POINT)
    return Workflow(slurm_cluster, work / "work", profile)


@pytest.fixture(scope="module")
def first_run(flow: Workflow) -> dict:
    """Preflight, then the sweep; when one benchmark job is left, scancel it."""
    preflight = run_logged([str(BIN / "hpcmem"), "preflight", "--profile", str(flow.profile),
                            "--snakefile", str(REPO / "workflow" / "Snakefile"),
                            "--directory", str(flow.workdir)], flow.cluster, cwd=flow.workdir)
    snakemake = flow.start(flow.command())

    def last_one_running():
        jobs = benchmark_jobs(flow.cluster)
        done = len(flow.records())
        if len(jobs) == 1 and jobs[0][1] == "RUNNING" and done == ALL_POINTS - 1:
            return jobs[0]
        return None

    def scancel(job: tuple[str, str, str]) -> None:
        assert flow.cluster.run("scancel", job[0]).returncode == 0

    (job_id, _, comment), output, took = interrupt_when(
        snakemake, last_one_running, "one benchmark job left", scancel)
    return {"preflight": preflight, "job_id": job_id, "comment": comment, "took": took,
            "output": output, "rc": snakemake.returncode}


def test_the_first_run_passes_the_preflight(first_run: dict) -> None:
    preflight = first_run["preflight"]
    assert preflight.returncode == 0, preflight.stdout
    assert "hpcmem preflight: ok: 7 rules fit cluster 'hpcmem': partitions batch, hbm; " \
        "accounts hpc; QOS bench" in preflight.stdout
    assert "hpcmem preflight: 7 rules fit cluster 'hpcmem'" in first_run["output"]


def test_a_cancelled_job_fails_the_run_naming_it(flow: Workflow, first_run: dict) -> None:
    output, job_id, comment = first_run["output"], first_run["job_id"], first_run["comment"]
    assert first_run["rc"] == 1, output
    assert first_run["took"] < 90, f"the run went on for {first_run['took']:.0f}s"
    assert (f"hpcmem: Slurm job {job_id} was cancelled underneath the run: it is not "
            "retried") in output, output
    # its point, as sacct says who cancelled it ("by 0": root)
    rule = comment.split("_wildcards_")[0].removeprefix("rule_")
    assert re.search(rf"hpcmem: 1 of \d+ points unfinished .*\n  {rule} .*: failed \(Slurm "
                     rf"job {job_id}: CANCELLED by 0\)", output), output
    assert ("hpcmem: the run failed. Finished points are kept: rerun the same command with "
            "--config run_id=e2e to redo the rest") in output
    assert not benchmark_jobs(flow.cluster)
    assert not list((flow.workdir / ".snakemake" / "locks").glob("*"))


@pytest.fixture(scope="module")
def rerun(flow: Workflow, first_run: dict) -> dict:
    """The rerun the workflow printed; fingerprints of the points finished before it."""
    finished = flow.records()
    before = fingerprint(finished)
    result = flow.run("--config", "run_id=e2e")
    return {"before": before, "result": result}


def test_the_rerun_redoes_only_the_cancelled_point(flow: Workflow, first_run: dict,
                                                   rerun: dict) -> None:
    output = rerun["result"].stdout
    assert rerun["result"].returncode == 0, output
    ran = re.findall(r"^rule (\w+):", output, re.MULTILINE)
    assert [rule for rule in ran if rule in BENCHMARKS] == [first_run["comment"].split("_wild")[0]
                                                            .removeprefix("rule_")]
    assert fingerprint(list(rerun["before"])) == rerun["before"]
    assert len(flow.records()) == ALL_POINTS
    assert "hpcmem: verdict" in output


def test_records_carry_job_partition_account_and_qos(flow: Workflow, rerun: dict) -> None:
    job_ids = set()
    for buffer, binding in POINTS:
        records = read_records(flow.point(buffer, binding).with_suffix(".jsonl"))
        assert records and [validate_record(r) for r in records] == [[]] * len(records)
        assert {r["status"] for r in records} == {"ok"}
        assert all(r["validated"] and r["ranks"] == 2 for r in records)
        assert all(r["container"] is None for r in records)  # container.enabled: false
        assert {r["system"] for r in records} == {"hpcmem:hbm"}
        assert sorted(r["size_bytes"] for r in records) == list(SIZES)
        (job_id,) = {r["slurm_job_id"] for r in records}
        job_ids.add(job_id)
        steps = flow.cluster.run("sacct", "-n", "-P", "-j", job_id,
                                 "-o", "JobID,NTasks,State,Partition,Account,QOS")
        rows = [line.split("|") for line in steps.stdout.splitlines()]
        assert rows[0] == [job_id, "", "COMPLETED", "hbm", "hpc", "bench"], steps.stdout
        assert [f"{job_id}.0", "2", "COMPLETED"] in [row[:3] for row in rows], steps.stdout
        ranks = records[0]["binding"]["per_rank"]
        assert {r["name"] for r in ranks} == {binding}
        if binding == "cores":
            assert sorted(r["cpus"] for r in ranks) == [[0], [1]]
            assert {r["mempolicy"]["mode"] for r in ranks} == {"local"}
        else:
            assert all(r["numactl"] == ["--cpunodebind=0", "--membind=0"] for r in ranks)
            assert {r["mempolicy"]["mode"] for r in ranks} == {"bind"}
        if buffer == "hbw":
            assert all(r["placement"]["emulated"] for r in records)
    assert len(job_ids) == len(POINTS)
    (train,) = read_records(flow.workdir / RUN / TRAIN)
    assert train["status"] == "skipped" and train["system"] == "hpcmem:batch"
    shown = flow.cluster.run("sacct", "-n", "-X", "-P", "-j", train["slurm_job_id"],
                             "-o", "Partition,Account,QOS").stdout.strip()
    assert shown == "batch|hpc|bench"


def test_the_reports_job_table_is_what_sacct_says_of_every_job_of_the_run(
    flow: Workflow, first_run: dict, rerun: dict
) -> None:
    # drawn by the rerun's summarise job: the first run's jobs (build, the benchmark points,
    # the one cancelled) and the rerun's (the cancelled point again, summarise)
    drawn = drawn_jobs((flow.workdir / RUN / "report" / "report.html").read_text())
    ids = submitted_from(flow.cluster, flow.workdir, flow.began)
    assert [row[0] for row in drawn] == sorted(ids, key=int)
    listed = flow.cluster.run("sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o",
                              "JobID,Partition,Account,QOS,State,Elapsed,ExitCode").stdout
    sacct = {line.split("|")[0]: line.split("|")[1:] for line in listed.splitlines()}
    points = {read_records(path)[0]["slurm_job_id"]: str(path.relative_to(flow.workdir / RUN))
              .removesuffix(".jsonl").split("/", 1) for path in flow.records()}
    cancelled = first_run["job_id"]
    sizes = []
    for job_id, named, *shown in drawn:
        shown, (rss, efficiency) = shown[:6], shown[6:]
        if job_id in points:  # a benchmark job: the point its records are of
            kind, folder = points[job_id]
            assert named == f"run_{kind} point={folder}", named
            # its CPU time used over allocated; its steps' largest resident set, where a
            # sample (every second on the test cluster) caught one
            assert re.fullmatch(r"\d+%", efficiency), efficiency
            assert rss == "-" or re.fullmatch(r"[\d.]+ (KiB|MiB|GiB)", rss), rss
            sizes.append(rss)
        elif job_id == cancelled:  # its point, redone by the rerun
            assert named in {row[1] for row in drawn if row[0] != cancelled}, named
            assert shown[3].startswith("CANCELLED") and shown[3] == sacct[job_id][3]
        else:
            assert named in ("build_wheel; install_wheel",
                             "aggregate_results; check_regressions; render_report"), named
        if named.startswith("aggregate_results"):  # the job drawing the table: still running
            assert shown[:3] == sacct[job_id][:3] and shown[3] == "RUNNING", shown
            assert sacct[job_id][3] == "COMPLETED" and shown[4] <= sacct[job_id][4]
        else:
            assert shown == sacct[job_id], job_id
    assert len(drawn) == ALL_POINTS + 3  # and the build, the cancelled job, summarise
    assert set(sizes) - {"-"}, sizes  # the points' MPI runs last seconds: sampled


def test_the_verdict_is_judged_for_the_benchmarks_partition(flow: Workflow, rerun: dict
                                                            ) -> None:
    run = flow.workdir / RUN
    assert "summary.parquet" in json.dumps(sorted(p.name for p in (run / "summary").iterdir()))
    assert (run / "check" / "exit_status").read_text().strip() == "0"
    assert "data:image/png;base64," in (run / "report" / "report.html").read_text()
    verdict = json.loads((run / "check" / "verdict.json").read_text())
    assert verdict["system"] == "hpcmem:hbm"  # the check job itself ran in batch
    assert {row["system"] for row in verdict["figures"]} == {"hpcmem:hbm"}


def test_a_failing_job_names_its_slurm_log_and_nothing_is_aggregated(flow: Workflow,
                                                                     rerun: dict) -> None:
    summary = flow.workdir / RUN / "summary" / "summary.parquet"
    before = fingerprint([summary])
    result = flow.run("--config", "run_id=e2e", FAILING)
    assert result.returncode == 1, result.stdout
    failed = re.search(r"SLURM-job '(\d+)' failed, SLURM status is: 'FAILED'", result.stdout)
    assert failed, result.stdout
    # Snakemake names the rule's log and the job's Slurm log side by side
    logs = re.search(rf"log: (\S+\.log), (\S+/rule_run_collectives/\S+/{failed[1]}\.log)",
                     result.stdout)  # fmt: skip
    assert logs, result.stdout
    rule_log, slurm_log = flow.workdir / logs[1], Path(logs[2])
    assert "Error in rule run_collectives" in slurm_log.read_text()
    assert "binding --membind='7': node 7 does not exist (nodes here: 0)" in rule_log.read_text()
    point = flow.point("numpy", "nowhere")
    assert not point.with_suffix(".jsonl").exists()
    assert not point.with_suffix(".osu.txt").exists()
    assert "rule aggregate_results:" not in result.stdout
    assert fingerprint([summary]) == before
    # the run ends listing what it left undone, and why: the failed points, each with the
    # Slurm job that ran it and what sacct says of it
    listed = (flow.workdir / RUN / "logs" / "unfinished.txt").read_text().splitlines()
    assert listed, result.stdout
    for line in listed:
        point, why = line.split("\t")
        assert point.startswith("run_collectives point=") and "binding=nowhere" in point, line
        assert re.fullmatch(r"failed \(Slurm job \d+: FAILED\)", why), line
    assert f"(Slurm job {failed[1]}: FAILED)" in "\n".join(listed)
    assert re.search(rf"hpcmem: {len(listed)} of \d+ points unfinished \(all in "
                     rf"\S+/logs/unfinished\.txt\):\n  run_collectives point=", result.stdout)


def history_runs(folder: Path) -> set[tuple[str, str, str]]:
    """``(run_id, system, verdict)`` of every run in a history store."""
    with sqlite3.connect(folder / "history.sqlite") as db:
        return set(db.execute("SELECT run_id, system, verdict FROM runs"))


@pytest.fixture(scope="module")
def dashboard_down() -> str:
    """The URL of an InfluxDB that is down: a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture(scope="module")
def calm_nightly(flow: Workflow, rerun: dict, dashboard_down: str
                 ) -> subprocess.CompletedProcess:  # fmt: skip
    """The nightly of run e2e, on the sweep the ad-hoc runs measured, pushing its figures to
    a dashboard that is down."""
    return flow.nightly(HPCMEM_EXPORT_TO=dashboard_down, HPCMEM_EXPORT_DATABASE="hpcmem")


def test_the_nightly_keeps_its_own_history_and_ends_in_its_summary(
    flow: Workflow, calm_nightly: subprocess.CompletedProcess, dashboard_down: str
) -> None:
    # within tolerance, but the push failed: exit 4, the server's answer in the summary
    assert calm_nightly.returncode == 4, calm_nightly.stdout
    lines = calm_nightly.stdout.splitlines()
    log = flow.workdir / RUN / "logs" / "nightly.log"
    assert len(lines) < 40, calm_nightly.stdout
    assert lines[1] == f"nightly: log     {log} (snakemake's output)"
    assert lines[2].startswith("hpcmem: PASS: ")  # the verdict's summary
    assert lines[-5:] == [
        f"nightly: PUSH FAILED (exit 4): --to: InfluxDB 1.x database 'hpcmem' at "
        f"{dashboard_down}: cannot reach the server ([Errno 111] Connection refused); nothing "
        "was pushed",
        f"nightly: log     {log}",
        f"nightly: report  {flow.workdir / RUN}/report/report.html",
        f"nightly: verdict {flow.workdir / RUN}/check/verdict.txt",
        f"nightly: run e2e within tolerance, but its figures did not reach {dashboard_down}"]
    # Snakemake's output, in the log: the sweep is measured already, so no point runs again
    assert "Building DAG of jobs" in log.read_text()
    results = flow.workdir / "results"
    assert history_runs(results / "history") == {("e2e", "hpcmem:hbm", "PASS")}  # ad hoc
    assert history_runs(results / "nightly-history") == {("e2e", "hpcmem:hbm", "PASS")}


@pytest.fixture(scope="module")
def terminated(flow: Workflow, calm_nightly: subprocess.CompletedProcess,
               influxdb: InfluxDB) -> dict:
    """The nightly with two more points, SIGTERM'd (all its processes, as Slurm does at a
    time limit or scancel) while a new point runs; then the next nightly, which is also
    checked against strict references (a regression) and pushes its figures to a fresh
    InfluxDB."""
    (flow.workdir / "config" / "more.yaml").write_text(yaml.safe_dump(MORE))
    configs = ("--configfile", str(flow.profile / "sweep.yaml"),
               str(flow.workdir / "config" / "more.yaml"))
    nightly = flow.start([str(REPO / "tools" / "nightly.sh"), *configs],
                         **flow.nightly_env())

    def new_point_running():
        return [job for job in benchmark_jobs(flow.cluster)
                if job[1] == "RUNNING" and job[2].startswith("rule_run_collectives")
                and job[2].endswith("_binding=none")]  # the executor's comment: its folder

    _, output, took = interrupt_when(nightly, new_point_running, "a new point running",
                                     lambda _: os.killpg(nightly.pid, signal.SIGTERM))
    queued = benchmark_jobs(flow.cluster)
    locks = list((flow.workdir / ".snakemake" / "locks").glob("*"))
    verdict = json.loads((flow.workdir / RUN / "check" / "verdict.json").read_text())
    (flow.workdir / "config" / "strict-references.yaml").write_text(
        'references:\n  "*:*":\n    "collectives/*/latency_us.avg": [0.001, null, 0.0, us]\n'
        "history:\n  shared_cores: judge\n"  # judged even on a busy node: this run must fail
    )
    (flow.workdir / "config" / "strict.yaml").write_text(
        yaml.safe_dump({"check": {"references": "config/strict-references.yaml"}})
    )
    following = flow.nightly(*configs, str(flow.workdir / "config" / "strict.yaml"),
                             HPCMEM_EXPORT_TO=influxdb.url, HPCMEM_EXPORT_DATABASE="nightly")
    return {"rc": nightly.returncode, "output": output, "took": took, "queued": queued,
            "locks": locks, "verdict": verdict, "next": following}


def test_sigterm_ends_the_nightly_cleanly(flow: Workflow, terminated: dict) -> None:
    output = terminated["output"]
    assert terminated["rc"] == 2, output
    assert terminated["took"] < 60, f"the nightly took {terminated['took']:.0f}s to end"
    assert terminated["queued"] == [] and terminated["locks"] == []
    assert terminated["verdict"]["verdict"] == "could not run"
    assert "SIGTERM" in terminated["verdict"]["reason"]
    assert len(output.splitlines()) < 40, output
    assert output.splitlines()[-2:] == [
        "nightly: to redo what did not finish, rerun the nightly with HPCMEM_RUN_ID=e2e (same "
        "profile and arguments)", f"nightly: verdict {flow.workdir / RUN}/check/verdict.txt"]
    # the workflow's own line says the nightly's way to redo it (HPCMEM_RERUN_HINT)
    assert ("hpcmem: the run was ended: SIGTERM received. Finished points are kept: rerun the "
            "nightly with HPCMEM_RUN_ID=e2e (same profile and arguments)") in output
    assert "rerun the same command with --config" not in output


def test_the_next_nightly_runs_without_unlock_exits_1_on_a_regression_and_pushes(
    flow: Workflow, terminated: dict, influxdb: InfluxDB
) -> None:
    following = terminated["next"]
    assert following.returncode == 1, following.stdout
    assert "LockException" not in following.stdout
    assert "nightly: REGRESSION in run e2e" in following.stdout
    # its figures reached the dashboard, FAIL included (the database created by the push)
    pushed = re.search(r"^nightly: pushed (\d+) figures to InfluxDB 1\.x database 'nightly' "
                       r"at \S+ \(created by this push\)$", following.stdout, re.M)
    assert pushed, following.stdout
    failed = influxdb.query("nightly", """SELECT count("value") FROM "hpcmem"
        WHERE "verdict" = 'FAIL' AND "run" = 'e2e'""")
    assert failed and failed[0]["count"] >= 1
    assert len(following.stdout.splitlines()) < 40, following.stdout
    verdict = json.loads((flow.workdir / RUN / "check" / "verdict.json").read_text())
    assert verdict["verdict"] == "FAIL"
    assert "FAIL" in (flow.workdir / RUN / "check" / "verdict.txt").read_text()
    assert len(flow.records()) == ALL_POINTS + 2  # MORE's two points


def test_scrontab_and_cron_entries_agree_and_slurm_accepts_the_options(
    slurm_cluster: SlurmCluster,
) -> None:
    # Debian 12's Slurm ships no scrontab binary: sbatch --test-only checks the #SCRON options
    scron = (REPO / "profiles" / "slurm" / "nightly.scrontab").read_text().splitlines()
    options = [line.removeprefix("#SCRON").strip() for line in scron if line.startswith("#SCRON")]
    assert not [option for option in options if option.startswith(("--partition", "-p"))]
    (schedule,) = [line for line in scron if line and not line.startswith("#")]
    cron = (REPO / "profiles" / "slurm" / "nightly.cron").read_text().splitlines()
    (cron_line,) = [line for line in cron if re.match(r"[\d*]", line)]
    assert schedule.split()[:5] == cron_line.split()[:5]  # same time
    command = "HPCMEM_PROFILE=hpcmem-site $HOME/hpcmem/tools/nightly.sh"
    assert " ".join(schedule.split()[5:]) == command
    assert " ".join(cron_line.split()[5:7]) == command
    test = slurm_cluster.run("sbatch", "--test-only", *options, "--wrap", "true")
    assert test.returncode == 0, test.stderr
    assert "to start at" in test.stderr
