"""Limits as Slurm applies them, without a cluster: an association inherits the ``Max``
limits it leaves unset from the nearest account above and is bound by every ``Grp`` limit
above; a run's jobs are queued at once wave by wave (the DAG's levels), at most ``jobs:``."""

from __future__ import annotations

import pytest

from hpcmem.errors import BadInputError
from hpcmem.slurm.facts import QueuedJob, queued_jobs
from hpcmem.slurm.limit_checks import job_findings, sweep_findings
from hpcmem.slurm.limits import Limits, applying
from hpcmem.slurm.requests import Grouping, JobRequest, SweepRequest
from hpcmem.slurm.values import minutes, tres

OWN = Limits("the association", counts={"MaxJobs": 4})
ACCOUNT = Limits("account 'physics'", tres={"GrpTRES": {"cpu": 8}}, counts={"MaxJobs": 2},
                 max_wall_min=60)
ABOVE = Limits("account 'science'", tres={"GrpTRES": {"cpu": 4}})
CHAIN = (OWN, ACCOUNT, ABOVE)


def test_max_limits_come_from_the_nearest_setter_and_grp_limits_from_every_one() -> None:
    assert applying(CHAIN, "MaxJobs") == [OWN]
    assert applying(CHAIN, "MaxWall") == [ACCOUNT]
    assert applying(CHAIN, "GrpTRES") == [ACCOUNT, ABOVE]


def test_a_job_is_held_to_every_group_limit_above_it() -> None:
    found = list(job_findings(JobRequest("build", cpus_per_task=6, runtime_min=90), [CHAIN]))
    assert found == [
        ("cpus_per_task: 6", "asks for 6 CPUs per job, more than account 'science' allows "
                             "(GrpTRES=cpu=4)"),
        ("runtime: 90", "minutes is longer than account 'physics' allows (MaxWall=60 minutes)")]


def test_points_after_one_build_are_queued_together_up_to_jobs() -> None:
    # build -> 4 points -> summarise
    needs = (frozenset(), *[frozenset({0})] * 4, frozenset({1, 2, 3, 4}))
    jobs = tuple(JobRequest(f"job{i}") for i in range(6))
    assert SweepRequest(jobs, needs).waves() == [[0], [1, 2, 3, 4], [5]]
    limits = [[(Limits("QOS 'bench'", counts={"MaxSubmitJobsPU": 3}),)]] * 6
    assert list(sweep_findings(SweepRequest(jobs, needs, most_at_once=3), limits)) == []
    [(setting, problem)] = sweep_findings(SweepRequest(jobs, needs, most_at_once=50), limits)
    assert setting == "jobs: 50"
    assert problem.startswith("lets 4 Slurm jobs be queued at once (the run submits 6, at most "
                              "4 at a time), more than QOS 'bench' allows (MaxSubmitJobsPU=3)")


def test_jobs_queued_already_count_against_max_submit_jobs() -> None:
    needs = (frozenset(), *[frozenset({0})] * 2, frozenset({1, 2}))
    jobs = tuple(JobRequest(f"job{i}") for i in range(4))
    bench = (Limits("QOS 'bench'", counts={"MaxSubmitJobsPU": 3}),)
    limits = [[bench]] * 4
    sweep = SweepRequest(jobs, needs, most_at_once=50)
    assert list(sweep_findings(sweep, limits, [[bench]])) == []  # 2 at once beside 1: 3
    [(setting, problem)] = sweep_findings(sweep, limits, [[bench]] * 2 + [[(OWN,)]])
    assert setting == "jobs: 50" and problem == (
        "lets 2 Slurm jobs be queued at once (the run submits 4, at most 2 at a time), more "
        "than QOS 'bench' allows (MaxSubmitJobsPU=3) beside the 2 of your jobs queued already "
        "(squeue --me): sbatch refuses the jobs past it; set jobs: 1 or fewer")
    [(_, full)] = sweep_findings(sweep, limits, [[bench]] * 3)
    assert full.endswith("queued already (squeue --me): sbatch refuses the jobs past it; "
                         "wait for your queued jobs to end")


def test_squeues_lines_of_the_users_jobs_are_read() -> None:
    assert queued_jobs("12|batch|HPC|Normal\nnot a job\n13|hbm|hpc|bench\n") == (
        QueuedJob("12", "batch", "hpc", "normal"), QueuedJob("13", "hbm", "hpc", "bench"))


@pytest.mark.parametrize(("text", "amounts"), [
    ("cpu=2,mem=4G,node=1", {"cpu": 2, "mem": 4096, "node": 1}),
    ("mem=512K,gres/gpu=1", {"mem": 1, "gres/gpu": 1}), ("", {})])
def test_tres_lists_read_as_slurm_prints_them(text: str, amounts: dict[str, int]) -> None:
    assert tres(text, "MaxTRESPerJob") == amounts


def test_times_read_as_sacctmgr_prints_them() -> None:
    assert [minutes(t, "MaxWall") for t in ("00:10:00", "2-03:05:00", "10", "UNLIMITED")] \
        == [10, 3065, 10, None]
    with pytest.raises(BadInputError, match="MaxWall: '1h' is not a time limit"):
        minutes("1h", "MaxWall")


def test_memory_nodes_and_gpus_per_job_and_per_node() -> None:
    qos = Limits("QOS 'gpu'", tres={"MaxTRESPerNode": {"cpu": 2, "mem": 2000, "gres/gpu": 1},
                                    "MaxTRESPerJob": {"node": 1, "mem": 6000}})
    request = JobRequest("train", tasks=4, nodes=2, cpus_per_task=2, mem_mb=4000, gpus=4)
    assert sorted(job_findings(request, [(qos,)])) == [
        ("gpu: 4", "asks for 2 GPUs per node, more than QOS 'gpu' allows "
                   "(MaxTRESPerNode=gres/gpu=1)"),
        ("mem_mb: 4000", "asks for 4000 MB of memory per node, more than QOS 'gpu' allows "
                         "(MaxTRESPerNode=mem=2000M)"),
        ("mem_mb: 4000 x nodes: 2", "asks for 8000 MB of memory per job, more than QOS 'gpu' "
                                    "allows (MaxTRESPerJob=mem=6000M)"),
        ("nodes: 2", "asks for 2 nodes per job, more than QOS 'gpu' allows "
                     "(MaxTRESPerJob=node=1)"),
        ("tasks: 2 x cpus_per_task: 2", "asks for 4 CPUs per node, more than QOS 'gpu' allows "
                                        "(MaxTRESPerNode=cpu=2)")]


def grouped_sweep(points: int, components: int, most_at_once: int | None) -> SweepRequest:
    """build -> the points in jobs of ``components`` each (group points) -> summarise."""
    groups = -(-points // components)
    needs = (frozenset(), *[frozenset({0})] * groups, frozenset(range(1, groups + 1)))
    jobs = tuple(JobRequest(f"job{i}") for i in range(groups + 2))
    grouping = Grouping("points", components, points, frozenset(range(1, groups + 1)))
    return SweepRequest(jobs, needs, most_at_once, (grouping,))


def test_grouped_points_queued_past_max_submit_jobs_name_the_group_components_that_fit() -> None:
    limits = [[(Limits("QOS 'sweep'", counts={"MaxSubmitJobsPU": 20}),)]] * 227
    # jobs: 20 would keep sbatch from refusing, but the sweep would wait its turn 12 times
    assert list(sweep_findings(grouped_sweep(225, 1, most_at_once=20), limits)) == [
        ("group-components: points=1", "puts 225 points in 225 Slurm jobs: 225 jobs queued at "
         "once (the run submits 227), more than QOS 'sweep' allows (MaxSubmitJobsPU=20): set "
         "group-components: points=12 or more")]
    assert list(sweep_findings(grouped_sweep(225, 12, most_at_once=50), limits[:21])) == []


def test_grouped_points_past_jobs_name_the_tightest_bound_once() -> None:
    [(setting, problem)] = sweep_findings(grouped_sweep(225, 1, most_at_once=50), [[]] * 227)
    assert setting == "group-components: points=1"
    assert problem.endswith("more than jobs: 50 lets Snakemake queue: set group-components: "
                            "points=5 or more")
    limits = [[(Limits("QOS 'sweep'", counts={"MaxSubmitJobs": 20}),)]] * 227
    [(_, problem)] = sweep_findings(grouped_sweep(225, 1, most_at_once=50), limits)
    assert problem.endswith("(MaxSubmitJobs=20): set group-components: points=12 or more")


def test_limits_on_running_jobs_still_name_jobs() -> None:
    limits = [[(Limits("the association", counts={"MaxJobs": 4}),)]] * 12
    assert list(sweep_findings(grouped_sweep(200, 20, most_at_once=50), limits)) == [
        ("jobs: 50", "lets 10 Slurm jobs be running at once (the run submits 12, at most 10 at "
                     "a time), more than the association allows (MaxJobs=4): the jobs past it "
                     "pend; set jobs: 4 or fewer")]


def test_jobs_grouping_cannot_fit_name_jobs() -> None:
    # build -> 2 jobs of 50 points and 25 training points -> summarise: even one job for
    # all the points leaves 26 jobs queued at once, past MaxSubmitJobsPU=20
    needs = (frozenset(), *[frozenset({0})] * 27, frozenset(range(1, 28)))
    jobs = tuple(JobRequest(f"job{i}") for i in range(29))
    sweep = SweepRequest(jobs, needs, 50, (Grouping("points", 50, 100, frozenset({1, 2})),))
    limits = [[(Limits("QOS 'sweep'", counts={"MaxSubmitJobsPU": 20}),)]] * 29
    [(setting, problem)] = sweep_findings(sweep, limits)
    assert setting == "jobs: 50"
    assert problem.startswith("lets 27 Slurm jobs be queued at once")
