"""`snakemake --profile profiles/slurm` end to end on the real one-node Slurm cluster.

The sweep (allreduce on numpy and emulated-HBW buffers, bindings cores and hbw, 2 ranks
under srun with PMIx) runs through sbatch: build, install, collectives, training (skipped
without a GPU), aggregate, check, report. One collectives job is cancelled with scancel
mid-run; a rerun with --rerun-incomplete redoes that point alone. Then a point whose
binding cannot be applied fails: Snakemake names its Slurm log, and nothing is aggregated.

The profile is profiles/slurm/config.yaml with its SITE lines set for the test cluster
(account, no GPU partition, two cores, quick status checks), as an admin would set them.
The workflow runs from a snapshot of the working tree, as a cluster runs one checkout.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from slurm_cluster import SlurmCluster

from hpcmem.results.records import read_records, validate_record

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN = Path("results", "e2e")
POINTS = [(buffer, binding) for buffer in ("numpy", "hbw") for binding in ("cores", "hbw")]
#: the sweep: every point runs for a few seconds, long enough to be cancelled mid-run
SWEEP = {
    "collectives": {
        "ops": ["allreduce"],
        "buffers": ["numpy", "hbw"],
        "ranks": [2],
        "bindings": ["cores", "hbw"],
        "emulate_hbw": "0",
        "min_size": 8,
        "max_size": 64,
        "iterations": 200000,
        "warmup": 10,
    },
    "train": {"models": ["transformer"], "params": ["125M"], "policies": ["hpcmem"],
              "gpu_budgets": ["none"], "steps": 2, "warmup": 1},
}  # fmt: skip
#: the message sizes of SWEEP: 8 to 64 bytes
SIZES = (8, 16, 32, 64)
#: a point whose numactl binding names a node that does not exist: its job fails
FAILING = {
    "collectives": {
        "bindings": ["cores", "hbw", "nowhere"],
        "custom_bindings": {"nowhere": "--membind=7"},
    }
}


def site_profile(folder: Path) -> Path:
    """profiles/slurm with its SITE settings for the one-node test cluster."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["slurm_account"] = "hpcmem"
    profile["set-resources"]["build_wheel"]["cpus_per_task"] = 2
    train = profile["set-resources"]["run_train"]
    train.update(slurm_partition="debug", gpu=0, cpus_per_task=1, mem_mb=2000)
    profile.update({"slurm-init-seconds-before-status-checks": 2, "retries": 0})
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def snapshot(folder: Path) -> Path:
    """A copy of the working tree without .git: jobs see one fixed source tree, so commits
    that land in this (shared) checkout during the test cannot change their parameters."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


@dataclass
class Workflow:
    """A working directory with the test config, run through the Slurm profile."""

    cluster: SlurmCluster
    workdir: Path
    profile: Path
    source: Path

    def command(self, *configs: str, extra: tuple[str, ...] = ()) -> list[str]:
        files = [str(self.workdir / "config" / name) for name in ("config.yaml", *configs)]
        return [
            str(BIN / "snakemake"), "--profile", str(self.profile),
            "--snakefile", str(self.source / "workflow" / "Snakefile"),
            "--directory", str(self.workdir), "--configfile", *files, *extra,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = self.cluster.env()
        env["PATH"] = f"{BIN}:{env['PATH']}"
        return env

    def start(self, *configs: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(*configs, extra=extra), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=self.env(), cwd=REPO,
        )  # fmt: skip

    def run(self, *configs: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*configs, extra=extra), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=self.env(), cwd=REPO, timeout=300,
        )  # fmt: skip

    def point(self, buffer: str, binding: str) -> Path:
        return self.workdir / RUN / "collectives" / "allreduce" / buffer / "ranks2" / binding


def fingerprint(paths: list[Path]) -> dict[Path, tuple[int, str]]:
    """mtime and sha256 of each file."""
    return {p: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths}


def cancel_a_running_point(flow: Workflow, snakemake: subprocess.Popen) -> tuple[str, Path]:
    """Once Snakemake has seen a point finish, scancel the collectives job that is running."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if snakemake.poll() is not None:
            raise AssertionError(f"the workflow ended early:\n{snakemake.communicate()[0]}")
        logs = flow.workdir.glob(".snakemake/log/*.snakemake.log")
        seen_done = any("(Rule: run_collectives)" in log.read_text() for log in logs)
        running = [p for p in POINTS if _measuring(flow.point(*p))]
        jobs = flow.cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k").stdout.splitlines()
        collectives = [j.split("|")[0] for j in jobs if "run_collectives" in j]
        if seen_done and len(running) == 1 and len(collectives) == 1:
            assert flow.cluster.run("scancel", collectives[0]).returncode == 0
            return collectives[0], flow.point(*running[0])
        time.sleep(0.3)
    raise AssertionError("no collectives point was running after another had finished")


def _measuring(point: Path) -> bool:
    """The ranks have printed the OSU header into the job's temporary OSU file
    (``<point>.osu.txt.<job shell PID>.tmp``) and are still measuring (sizes left to do)."""
    try:
        osu = next(point.parent.glob(point.stem + ".osu.txt.*.tmp"))
        lines = osu.read_text().splitlines()
    except (StopIteration, FileNotFoundError):
        return False
    rows = [line for line in lines if line and not line.startswith("#")]
    return bool(lines) and len(rows) < len(SIZES)


@pytest.fixture(scope="module")
def flow(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    """The sweep, with one job cancelled mid-run; returns the working directory afterwards."""
    work = tmp_path_factory.mktemp("slurm-workflow")
    shutil.copytree(REPO / ".test" / "config", work / "config")
    (work / "config" / "slurm.yaml").write_text(yaml.safe_dump(SWEEP))
    (work / "config" / "failing.yaml").write_text(yaml.safe_dump(FAILING))
    return Workflow(slurm_cluster, work, site_profile(work / "profile"), snapshot(work / "src"))


def wait_cancelled(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> None:
    """Wait until sacct reports ``job_id`` cancelled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State").stdout
        if state.startswith("CANCELLED"):
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} was not cancelled within {timeout}s")


@pytest.fixture(scope="module")
def cancelled(flow: Workflow) -> dict:
    """Run the sweep, scancel one collectives job mid-run, then stop Snakemake with Ctrl-C.

    sacct reports a job cancelled by a user as 'CANCELLED by UID', which the executor
    plugin (2.8) does not recognise: it would wait for that job forever. The admin stops
    the workflow (Ctrl-C cancels its other jobs) and reruns it with --rerun-incomplete.
    """
    snakemake = flow.start("slurm.yaml")
    try:
        job_id, point = cancel_a_running_point(flow, snakemake)
        wait_cancelled(flow.cluster, job_id)
        snakemake.send_signal(signal.SIGINT)
        output, _ = snakemake.communicate(timeout=120)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
            snakemake.communicate()
    return {"job_id": job_id, "point": point, "output": output, "rc": snakemake.returncode}


def test_a_cancelled_job_is_recovered_without_redoing_finished_points(flow, cancelled) -> None:
    assert cancelled["rc"] != 0, cancelled["output"]
    point: Path = cancelled["point"]
    assert not point.with_suffix(".jsonl").exists()  # nothing half-written looks finished
    assert not point.with_suffix(".osu.txt").exists()
    finished = sorted(flow.workdir.glob(f"{RUN}/collectives/**/*.jsonl"))
    assert 1 <= len(finished) < len(POINTS)
    before = fingerprint(finished + [p.with_suffix(".osu.txt") for p in finished])

    rerun = flow.run("slurm.yaml", extra=("--rerun-incomplete",))
    assert rerun.returncode == 0, rerun.stdout
    assert rerun.stdout.count("rule run_collectives:") == len(POINTS) - len(finished)
    assert f"output: {point.relative_to(flow.workdir).with_suffix('.jsonl')}" in rerun.stdout
    assert fingerprint(list(before)) == before
    assert "hpcmem: verdict" in rerun.stdout


def test_records_carry_slurm_job_ids_and_the_applied_binding(flow, cancelled) -> None:
    job_ids = set()
    for buffer, binding in POINTS:
        records = read_records(flow.point(buffer, binding).with_suffix(".jsonl"))
        assert records and [validate_record(r) for r in records] == [[]] * len(records)
        assert {r["status"] for r in records} == {"ok"}
        assert all(r["validated"] and r["ranks"] == 2 for r in records)
        assert all(r["container"] is None for r in records)  # auto, and no runtime here
        assert sorted(r["size_bytes"] for r in records) == list(SIZES)
        (job_id,) = {r["slurm_job_id"] for r in records}
        job_ids.add(job_id)
        steps = flow.cluster.run("sacct", "-n", "-P", "-j", job_id, "-o", "JobID,NTasks,State")
        rows = [line.split("|") for line in steps.stdout.splitlines()]
        assert rows[0] == [job_id, "", "COMPLETED"], steps.stdout
        assert [f"{job_id}.0", "2", "COMPLETED"] in rows, steps.stdout  # the srun step: 2 ranks
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
    assert cancelled["job_id"] not in job_ids


def test_aggregate_check_and_report_ran_on_the_cluster(flow, cancelled) -> None:
    run = flow.workdir / RUN
    summary = json.dumps(sorted(p.name for p in (run / "summary").iterdir()))
    assert "summary.parquet" in summary
    assert (run / "check" / "exit_status").read_text().strip() == "0"
    assert "data:image/png;base64," in (run / "report" / "report.html").read_text()
    (train,) = read_records(run / "train" / "transformer" / "125M" / "hpcmem" / "budget_none.jsonl")
    assert train["status"] == "skipped" and train["slurm_job_id"]


def test_a_failing_job_names_its_slurm_log_and_nothing_is_aggregated(flow, cancelled) -> None:
    summary = flow.workdir / RUN / "summary" / "summary.parquet"
    before = fingerprint([summary])
    result = flow.run("slurm.yaml", "failing.yaml")
    assert result.returncode == 1, result.stdout
    failed = re.search(r"SLURM-job '(\d+)' failed, SLURM status is: 'FAILED'", result.stdout)
    assert failed, result.stdout
    # Snakemake names the rule's log and the job's Slurm log side by side
    logs = re.search(rf"log: (\S+\.log), (\S+/rule_run_collectives/\S+/{failed[1]}\.log)",
                     result.stdout)  # fmt: skip
    assert logs, result.stdout
    rule_log, slurm_log = flow.workdir / logs[1], Path(logs[2])
    assert "Error in rule run_collectives" in slurm_log.read_text()
    assert "binding --membind=7: node 7 does not exist (nodes here: 0)" in rule_log.read_text()
    point = flow.point("numpy", "nowhere")
    assert not point.with_suffix(".jsonl").exists()
    assert not point.with_suffix(".osu.txt").exists()
    assert "rule aggregate_results:" not in result.stdout
    assert fingerprint([summary]) == before


def nightly(flow: Workflow, *configs: str) -> subprocess.CompletedProcess:
    """tools/nightly.sh of the snapshot, on the test profile, for run e2e."""
    venv = flow.source / ".venv"
    if not venv.exists():
        venv.symlink_to(REPO / ".venv")
    env = flow.env()
    env.update(HPCMEM_PROFILE=str(flow.profile), HPCMEM_WORKDIR=str(flow.workdir),
               HPCMEM_RUN_ID="e2e")  # fmt: skip
    names = ("config.yaml", "slurm.yaml", *configs)
    files = [str(flow.workdir / "config" / name) for name in names]
    return subprocess.run(
        [str(flow.source / "tools" / "nightly.sh"), "--configfile", *files],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_nightly_sweep_exits_1_on_a_regression(flow, cancelled) -> None:
    calm = nightly(flow)
    assert calm.returncode == 0, calm.stdout
    assert "nightly: run e2e within tolerance" in calm.stdout
    history = flow.workdir / "results" / "history"
    assert any(history.iterdir())

    (flow.workdir / "config" / "strict-references.yaml").write_text(
        'references:\n  "*:*":\n    "collectives/*/latency_us.avg": [0.001, null, 0.0, us]\n'
    )
    (flow.workdir / "config" / "strict.yaml").write_text(
        yaml.safe_dump({"check": {"references": "config/strict-references.yaml"}})
    )
    regression = nightly(flow, "strict.yaml")
    assert regression.returncode == 1, regression.stdout
    assert "nightly: REGRESSION in run e2e" in regression.stdout
    assert "FAIL" in (flow.workdir / RUN / "check" / "verdict.txt").read_text()


def test_scrontab_and_cron_entries_agree_and_slurm_accepts_the_options(
    slurm_cluster: SlurmCluster,
) -> None:
    # Debian 12's Slurm ships no scrontab binary: sbatch --test-only checks the #SCRON options
    scron = (REPO / "profiles" / "slurm" / "nightly.scrontab").read_text().splitlines()
    options = [line.removeprefix("#SCRON").strip() for line in scron if line.startswith("#SCRON")]
    (schedule,) = [line for line in scron if line and not line.startswith("#")]
    cron = (REPO / "profiles" / "slurm" / "nightly.cron").read_text().splitlines()
    (cron_line,) = [line for line in cron if re.match(r"[\d*]", line)]
    assert schedule.split()[:5] == cron_line.split()[:5]  # same time
    assert schedule.split()[5] == cron_line.split()[5] == "$HOME/hpcmem/tools/nightly.sh"
    test = slurm_cluster.run("sbatch", "--test-only", *options, "--wrap", "true")
    assert test.returncode == 0, test.stderr
    assert "to start at" in test.stderr
