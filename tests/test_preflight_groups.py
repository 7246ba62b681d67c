"""The preflight of Snakemake groups (rules submitted together as one Slurm job), on a
cluster described as ``sinfo`` and ``sacctmgr`` would (accounting off): rules that disagree
on a text setting, and a combined job that does not fit where each of its rules does."""

from __future__ import annotations

from hpcmem.slurm.facts import ClusterFacts, NodeFacts, PartitionFacts
from hpcmem.slurm.preflight import (
    Grouping,
    GroupRequest,
    JobRequest,
    RunSettings,
    SweepRequest,
    check,
)

NODE = NodeFacts("node1", cpus=4, memory_mb=16000, gpus=0, features=frozenset())
FACTS = ClusterFacts(
    name="site", user="alice", enforce=frozenset(), accounting_disabled=True,
    partitions={"batch": PartitionFacts("batch", "UP", True, 60, None, frozenset(), None,
                                        frozenset(), (NODE,))},
)  # fmt: skip
RULES = ("aggregate_results", "check_regressions", "render_report")


def summarise(runtimes: dict[str, int], partitions: dict[str, str | None]) -> tuple:
    """The rules' own requests and their group, combined as Snakemake combines them."""
    rules = [JobRequest(rule, partition=partitions[rule], runtime_min=runtimes[rule])
             for rule in RULES]
    agree = len(set(partitions.values())) == 1
    combined = JobRequest("group summarise", partition=partitions[RULES[0]],
                          runtime_min=sum(runtimes.values())) if agree else None
    return rules, GroupRequest("summarise", RULES, {"slurm_partition": partitions}, combined)


def test_a_group_whose_summed_runtime_passes_maxtime_is_named() -> None:
    rules, group = summarise(dict.fromkeys(RULES, 30), dict.fromkeys(RULES, "batch"))
    assert check(rules, RunSettings(), FACTS) == []  # each rule fits
    assert check(rules, RunSettings(), FACTS, [group]) == [
        "runtime: 90 (group summarise: aggregate_results + check_regressions + render_report) "
        "minutes is longer than partition 'batch' allows (MaxTime 60 minutes)"]


def test_rules_of_a_group_asking_for_different_partitions_are_one_line() -> None:
    partitions = {"aggregate_results": "batch", "check_regressions": None,
                  "render_report": "batch"}
    rules, group = summarise(dict.fromkeys(RULES, 30), partitions)
    assert check(rules, RunSettings(), FACTS, [group]) == [
        "slurm_partition: differs within group 'summarise' (aggregate_results: 'batch'; "
        "check_regressions: unset; render_report: 'batch') but a group is one Slurm job: "
        "give its rules one value, or run a rule on its own (snakemake --groups RULE=NAME)"]


def test_what_a_rule_already_gets_is_not_said_again_for_its_group() -> None:
    rules, group = summarise(dict.fromkeys(RULES, 10), dict.fromkeys(RULES, "batch"))
    rules[0] = JobRequest(RULES[0], partition="batch", cpus_per_task=8, runtime_min=10)
    group = GroupRequest(group.name, RULES, group.text_settings, JobRequest(
        "group summarise", partition="batch", cpus_per_task=8, runtime_min=30))
    assert check(rules, RunSettings(), FACTS, [group]) == [
        "cpus_per_task: 8 (rule aggregate_results) is more CPUs than a node of partition "
        "'batch' has (at most 4)"]


def test_two_groups_past_maxtime_by_the_same_minutes_are_each_named() -> None:
    rules, group = summarise(dict.fromkeys(RULES, 25), dict.fromkeys(RULES, "batch"))
    build = GroupRequest("build", ("build_wheel", "install_wheel"), {}, JobRequest(
        "group build", partition="batch", runtime_min=75))
    assert check(rules, RunSettings(), FACTS, [build, group]) == [
        f"runtime: 75 (group {name}) minutes is longer than partition 'batch' allows "
        "(MaxTime 60 minutes)"
        for name in ("build: build_wheel + install_wheel",
                     "summarise: aggregate_results + check_regressions + render_report")]


def test_grouped_points_past_maxtime_name_the_group_components_that_fit() -> None:
    # 25 points of 4 minutes a job: 100 minutes past MaxTime 60; 15 of them fit
    point = JobRequest("run_collectives", partition="batch", runtime_min=4)
    group = GroupRequest("points", ("run_collectives",), {}, JobRequest(
        "group points", partition="batch", runtime_min=100))
    sweep = SweepRequest((group.combined,) * 4, (frozenset(),) * 4, groupings=(
        Grouping("points", components=25, points=100, jobs=frozenset(range(4))),))
    assert check([point], RunSettings(), FACTS, [group], sweep) == [
        "runtime: 100 (group points: run_collectives) minutes is longer than partition "
        "'batch' allows (MaxTime 60 minutes): set group-components: points=15 or fewer"]
