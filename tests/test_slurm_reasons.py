"""Slurm strings the preflight and the watchdog read: Gres GPU counts and pending reasons
(squeue's reason codes, as Slurm 22.05 prints them)."""

from __future__ import annotations

import pytest

from hpcmem.slurm.facts import gpu_count
from hpcmem.slurm.watchdog import StuckJob, hopeless


@pytest.mark.parametrize(("gres", "gpus"), [
    ("(null)", 0), ("gpu:4", 4), ("gpu:h100:4(S:0-1)", 4), ("gpu:a100:2,gpu:v100:1", 3),
    ("shard:8,gpu:h200:8(S:0-1)", 8), ("gpu", 1), ("mps:100", 0),
])  # fmt: skip
def test_gpu_count_of_gres(gres: str, gpus: int) -> None:
    assert gpu_count(gres) == gpus


@pytest.mark.parametrize("reason", [
    "PartitionConfig", "PartitionTimeLimit", "PartitionNodeLimit", "BadConstraints",
    "InvalidQOS", "InvalidAccount", "DependencyNeverSatisfied", "QOSMaxCpuPerJobLimit",
    "QOSMaxWallDurationPerJobLimit", "AssocMaxNodePerJobLimit", "QOSMaxGRESPerJob",
    "QOSMinCpuNotSatisfied",
])  # fmt: skip
def test_reasons_that_never_clear(reason: str) -> None:
    assert hopeless(reason)


@pytest.mark.parametrize("reason", [
    "None", "Priority", "Resources", "Dependency", "BeginTime", "JobHeldUser", "PartitionDown",
    "ReqNodeNotAvail", "QOSGrpCpuLimit", "AssocGrpJobsLimit", "QOSMaxJobsPerUserLimit",
    "AssocMaxJobsLimit", "QOSJobLimit", "Reservation",
])  # fmt: skip
def test_reasons_that_clear_or_need_a_person(reason: str) -> None:
    assert not hopeless(reason)


def test_a_stuck_job_names_itself_and_why() -> None:
    assert StuckJob("42", "CANCELLED by 0", "", "rule_run_train").describe() == \
        "Slurm job 42 (rule_run_train) was CANCELLED by 0"
    assert StuckJob("43", "PENDING", "InvalidQOS", "").describe() == \
        "Slurm job 43 is PENDING with Reason=InvalidQOS, which does not clear by itself"
