"""A sweep in few Slurm jobs, on the site-like test cluster.

At full size (``HPCMEM_GROUPED_SWEEP=200``): under an association that lets 20 jobs be
queued at once (MaxSubmitJobs=20, and `jobs: 20` in the profile), the template's grouping
(group points, 25 points per Slurm job) runs 200 points in 8 jobs, 10 with the build and
the summary: one submission per 20 points, never more than 20 jobs queued at once (sacct's
submit and end times), each job named after the run. Grouped 5 per job, the same sweep
would queue 40 jobs at once: the preflight refuses it, naming the group-components that
fit. Once every job of points is queued, one that runs is cancelled (at the template's
``retries: 1``): it fails alone and is not retried, the other jobs run all their points,
and the run ends listing the cancelled job's unfinished points. The rerun redoes those, no
other, in one more job, and leaves every other record as it was.

Each point is as cheap as one gets (one rank, one 8-byte message, one iteration, one
repeat): what it costs is Snakemake's own start for each point in its job, about 3 s on 2
cores, so the full size takes 11 to 17 minutes. By default (``make test``) the same tests
run 10 points (2 of the operations), 5 per job, under MaxSubmitJobs=2, and grouped 2 per
job the preflight refuses them: the same rules at a twentieth of the size.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pytest
from slurm_cluster import SlurmCluster
from slurm_site import (
    BIN,
    REPO,
    checkout_workdir,
    limited_account,
    preflight,
    run_logged,
    site_profile,
    submitted_from,
)

from hpcmem.record.jsonl import read_records

pytestmark = pytest.mark.slurm



OPS = ("bcast", "gather", "allreduce", "reduce", "allgather", "alltoall", "scatter",
       "reduce_scatter")


@dataclass(frozen=True)
class Size:
    """How big the sweep is: its operations and bindings (x 5 buffers, one rank), points per
    Slurm job, the association's MaxSubmitJobs (and the profile's jobs:), a grouping that
    queues more jobs than that, and the fewest points per job the preflight then names."""

    ops: tuple[str, ...]
    bindings: tuple[str, ...]
    per_job: int
    most_queued: int
    refused_per_job: int
    fewest_per_job: int
    #: profile settings beyond the template's
    profile: dict = field(default_factory=dict)

    @property
    def points(self) -> int:
        return len(self.ops) * 5 * len(self.bindings)


SIZES = {
    "200": Size(OPS, ("none", "cores", "hbw", "dram", "interleave"), per_job=25,
                most_queued=20, refused_per_job=5,
                fewest_per_job=10),  # the template's group-components: 25
    "10": Size(OPS[:2], ("none",), per_job=5, most_queued=2, refused_per_job=2,
               fewest_per_job=5, profile={"group-components": {"points": 5}}),
}
SIZE = SIZES[os.environ.get("HPCMEM_GROUPED_SWEEP", "10")]
#: the sweep: the size's ops x 5 buffers x its bindings, one rank each
SWEEP = {
    "container": {"enabled": False},
    "collectives": {
        "ops": list(SIZE.ops),
        "buffers": ["numpy", "hbw", "hbw_preferred", "hbw_interleave", "mpi_alloc"],
        "tasks_per_node": [1],
        "bindings": list(SIZE.bindings),
        "emulate_hbw": "0", "min_size": 8, "max_size": 8, "iterations": 1, "warmup": 0,
        "repeats": 1,
    },
    "train": {"enabled": False},
}  # fmt: skip
POINTS, PER_JOB, MOST_QUEUED = SIZE.points, SIZE.per_job, SIZE.most_queued
ACCOUNT = "grouped"
RUN_ID = "groups"
RECORDS = Path("results", RUN_ID, "collectives")
#: the run's job name: the workflow's prefix for run RUN_ID, then the executor's uuid
JOB_NAME = re.compile(rf"hpcmem-{RUN_ID}_[0-9a-f-]{{36}}")


@dataclass
class Sweep:
    """The working directory, the site profile, and the cluster they run on."""

    cluster: SlurmCluster
    workdir: Path
    profile: Path

    def command(self) -> list[str]:
        return [str(BIN / "snakemake"), "--profile", str(self.profile),
                "--snakefile", str(REPO / "workflow" / "Snakefile"),
                "--directory", str(self.workdir), "--config", f"run_id={RUN_ID}"]

    def records(self) -> dict[Path, tuple[int, str]]:
        """mtime and sha256 of each record file of a finished point."""
        return {path: (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
                for path in (self.workdir / RECORDS).glob("**/*.jsonl")}

    def points_jobs(self) -> list[tuple[str, str]]:
        """``(job id, state)`` of the run's queued jobs of points."""
        queued = self.cluster.run("squeue", "-h", "-o", "%i|%T|%j|%k").stdout.splitlines()
        return [(job_id, state) for job_id, state, name, comment in
                (line.split("|", 3) for line in queued)
                if JOB_NAME.fullmatch(name) and comment.startswith("rule_points_")]

    def jobs_since(self, since: str) -> list[SlurmJob]:
        """The jobs submitted from the working directory since ``since`` (sacct; all
        ended)."""
        ids = submitted_from(self.cluster, self.workdir, since)
        listed = self.cluster.run("sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o",
                                  "JobIDRaw,JobName%80,Submit,End,NCPUS,Timelimit").stdout
        return [SlurmJob(*line.split("|")) for line in listed.splitlines()]


class SlurmJob(NamedTuple):
    """A job as sacct lists it."""

    job_id: str
    name: str
    submit: str
    end: str
    cpus: str
    time_limit: str


def most_at_once(jobs: list[SlurmJob]) -> int:
    """The most of ``jobs`` queued or running at once, from their submit and end times
    (a job ending in the second another is submitted is counted out first)."""
    events = sorted([(job.submit, 1) for job in jobs] + [(job.end, -1) for job in jobs])
    counts = [0]
    for _, change in events:
        counts.append(counts[-1] + change)
    return max(counts)


@pytest.fixture(scope="module")
def sweep(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """The site's profile as the template has it (jobs: 20, retries: 1), under
    MaxSubmitJobs=20."""
    limited_account(slurm_cluster, ACCOUNT, None, own=(f"MaxSubmitJobs={MOST_QUEUED}",))
    work = tmp_path_factory.mktemp("grouped")
    profile = site_profile(work / "hpcmem", slurm_cluster, SWEEP, jobs=MOST_QUEUED, retries=1,
                           **{"slurm-qos": "normal", "default-resources__slurm_account": ACCOUNT,
                              **SIZE.profile})
    (work / "work").mkdir()
    return Sweep(slurm_cluster, checkout_workdir(work / "work"), profile)


def test_points_grouped_past_max_submit_jobs_are_refused(sweep: Sweep, tmp_path: Path
                                                         ) -> None:
    profile = site_profile(tmp_path / "hpcmem", sweep.cluster, SWEEP, jobs=MOST_QUEUED, **{
        "slurm-qos": "normal", "default-resources__slurm_account": ACCOUNT,
        "group-components": {"points": SIZE.refused_per_job}})
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = preflight(sweep.cluster, profile, sweep.workdir)
    assert result.returncode == 2, result.stdout
    grouped = SIZE.refused_per_job
    jobs = POINTS // grouped
    assert result.stdout.splitlines() == [
        f"hpcmem preflight: group-components: points={grouped} puts {POINTS} points in {jobs} "
        f"Slurm jobs: {jobs} jobs queued at once (the run submits {jobs + 2}), more than the "
        f"association of user 'root' with account '{ACCOUNT}' allows "
        f"(MaxSubmitJobs={MOST_QUEUED}): set group-components: points={SIZE.fewest_per_job} "
        "or more",
        "hpcmem preflight: 1 problem(s): fix them before submitting"]
    assert submitted_from(sweep.cluster, sweep.workdir, since) == []


def first_job_running(sweep: Sweep, process: subprocess.Popen, log: Path) -> str:
    """The id of a job of points once it runs, while every job of points is queued."""
    deadline = time.monotonic() + 1500
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ended before its jobs of points ran:\n{log.read_text()}")
        jobs = sweep.points_jobs()
        running = [job_id for job_id, state in jobs if state == "RUNNING"]
        if len(jobs) == POINTS // PER_JOB and running:
            return running[0]
        time.sleep(0.5)
    raise AssertionError("no job of points running in time")


@pytest.fixture(scope="module")
def first_run(sweep: Sweep) -> dict:
    """The sweep, at the template's ``retries: 1``; when its first job of points runs,
    scancel it. Its output goes to a file: a pipe read only at the end would fill and stop
    Snakemake mid-sweep."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    began = time.monotonic()
    log = sweep.workdir.parent / "first-run.log"
    with log.open("w") as output:
        process = subprocess.Popen(sweep.command(), stdout=output, stderr=subprocess.STDOUT,
                                   cwd=sweep.workdir, start_new_session=True,
                                   env={**sweep.cluster.env(),
                                        "PATH": f"{BIN}:{os.environ['PATH']}"})  # fmt: skip
    try:
        cancelled = first_job_running(sweep, process, log)
        assert sweep.cluster.run("scancel", cancelled).returncode == 0
        process.wait(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    print(f"the first run took {time.monotonic() - began:.0f}s")
    return {"output": log.read_text(), "rc": process.returncode, "cancelled": cancelled,
            "jobs": sweep.jobs_since(since), "records": sweep.records()}


def test_one_submission_per_group_never_more_than_allowed_queued(first_run: dict) -> None:
    jobs = first_run["jobs"]
    # the build, and the jobs of points: the cancelled one not retried
    assert len(jobs) == 1 + POINTS // PER_JOB
    if PER_JOB > 20:  # at full size the build fits in one submission per 20 points as well
        assert len(jobs) <= POINTS // 20, jobs
    assert most_at_once(jobs) <= MOST_QUEUED
    assert {JOB_NAME.fullmatch(job.name) is not None for job in jobs} == {True}
    assert len({job.name for job in jobs}) == 1  # one run
    # a job of points asks for one point's CPUs (one rank: 2 tasks of 1 CPU) and the sum
    # of its points' runtimes (1 minute each), not for 25 points side by side
    _, *points = sorted(jobs, key=lambda job: job.submit)  # the build first
    assert {(job.cpus, job.time_limit) for job in points} == {("2", f"00:{PER_JOB:02d}:00")}


def test_a_cancelled_job_of_points_fails_alone(sweep: Sweep, first_run: dict) -> None:
    output, cancelled = first_run["output"], first_run["cancelled"]
    assert first_run["rc"] == 1, output
    assert (f"hpcmem: Slurm job {cancelled} was cancelled underneath the run: it is not "
            "retried") in output, output
    # every other job of points ran all its points
    job_of = {path: read_records(path)[0]["slurm_job_id"] for path in first_run["records"]}
    others = [job for job in job_of.values() if job != cancelled]
    assert len(others) == POINTS - PER_JOB, output
    unfinished = (sweep.workdir / "results" / RUN_ID / "logs" / "unfinished.txt").read_text()
    lines = unfinished.splitlines()
    assert 0 < len(lines) == POINTS - len(first_run["records"]), unfinished
    assert {line.split("\t")[1] for line in lines} == {
        f"failed (Slurm job {cancelled}: CANCELLED by 0)"}, unfinished
    assert re.search(r"hpcmem: the run failed\. Finished points are kept: rerun the same "
                     rf"command with --config run_id={RUN_ID} to redo the rest", output)


@pytest.fixture(scope="module")
def rerun(sweep: Sweep, first_run: dict) -> dict:
    """The same command again; the records before it, and the points they lacked."""
    before = sweep.records()
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = run_logged(sweep.command(), sweep.cluster, cwd=sweep.workdir, timeout=600)
    return {"before": before, "result": result, "jobs": sweep.jobs_since(since)}


def test_the_rerun_redoes_only_the_cancelled_jobs_points(sweep: Sweep, first_run: dict,
                                                         rerun: dict) -> None:
    output, before = rerun["result"].stdout, rerun["before"]
    assert rerun["result"].returncode == 0, output
    after = sweep.records()
    assert len(after) == POINTS
    assert {path: after[path] for path in before} == before  # untouched
    redone = set(after) - set(before)
    assert len(re.findall(r"^\s*rule run_collectives:", output, re.MULTILINE)) == len(redone)
    # the cancelled job's points: those it finished (kept) and those the rerun redid
    job_of = {path: read_records(path)[0]["slurm_job_id"] for path in after}
    kept = {path for path in before if job_of[path] == first_run["cancelled"]}
    assert redone and len(kept) + len(redone) == PER_JOB
    # in one job of points, and the summary's
    assert len(rerun["jobs"]) == 2
    assert len({job_of[path] for path in redone}) == 1
