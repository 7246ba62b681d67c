"""Slurm strings the preflight, the watchdog and the plugin's status query read: Gres GPU
counts, pending reasons (squeue's reason codes, as Slurm 22.05 prints them), sacct's states,
and lines of scontrol and sinfo, as Slurm prints them and as odd versions and site wrappers
do (named, not a traceback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile_inputs import site_wrapper

from hpcmem.inputs import InputError
from hpcmem.slurm.facts import (
    SlurmCommandError,
    gpu_count,
    node_facts,
    partition_facts,
    slurm_command,
)
from hpcmem.slurm.watchdog import StuckJob, hopeless
from hpcmem.workflow.slurm_jobs import read_cancelled


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
    assert StuckJob("43", "PENDING", "InvalidQOS", "rule_run_train").describe() == (
        "Slurm job 43 (rule_run_train) is PENDING with Reason=InvalidQOS, which does not "
        "clear by itself")


def test_a_job_someone_cancelled_reads_as_the_plugins_cancelled() -> None:
    states = {"41": "RUNNING", "42": "CANCELLED by 0", "43": "CANCELLED", "44": "COMPLETED",
              "45": "CANCELLED by 1001"}
    cancelled: set[str] = set()
    read_cancelled(states, cancelled)
    assert states == {"41": "RUNNING", "42": "CANCELLED", "43": "CANCELLED",
                      "44": "COMPLETED", "45": "CANCELLED"}
    assert cancelled == {"42", "45"}  # someone's scancel; 43 (squeue's word) is not told apart


@pytest.mark.parametrize(("line", "max_time"), [
    ("PartitionName=batch Default=YES MaxTime=UNLIMITED State=UP", None),
    ("PartitionName=hbm MaxTime=1-02:00:30 State=UP", 26 * 60 + 1),
    ("PartitionName=short MaxTime=00:30:00 State=DOWN", 30),
])  # fmt: skip
def test_a_partition_line_of_scontrol(line: str, max_time: int | None) -> None:
    assert partition_facts(line).max_time_min == max_time


@pytest.mark.parametrize(("line", "message"), [
    ("PartitionName=batch MaxTime=abc State=UP",
     "`scontrol show partition -o` MaxTime: 'abc' is not a time limit (accepted: "
     "[days-]hours:minutes:seconds, or UNLIMITED)"),
    ("PartitionName=batch MaxTime=\u0663:00:00", "MaxTime: '\u0663:00:00' is not a time limit"),
    ("Partition batch is UP", "`scontrol show partition -o`: 'Partition batch is UP' is a line "
     "without PartitionName= (accepted: one partition per line: PartitionName=NAME Key=value"),
])  # fmt: skip
def test_a_partition_line_not_in_scontrols_form_is_named(line: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        partition_facts(line)
    assert message in str(raised.value)


def test_a_node_line_of_sinfo() -> None:
    partition, node = node_facts("hbm|node1|112|257000|gpu:h100:4(S:0-1)|hbm,flat")
    assert (partition, node.name, node.cpus, node.memory_mb, node.gpus, node.features) == \
        ("hbm", "node1", 112, 257000, 4, frozenset({"hbm", "flat"}))


@pytest.mark.parametrize(("line", "message"), [
    ("batch|node1|\u00b2|1000|(null)|(null)", "CPUS: '\u00b2' is not a whole number"),
    ("batch|node1|4|99999999999999999999|(null)|(null)",
     "MEMORY_MB: '99999999999999999999' is out of range"),
    ("sinfo: warning: wrapper in use", "'sinfo: warning: wrapper in use' is not six fields "
     "separated by '|' (accepted: PARTITION|NODE|CPUS|MEMORY_MB|GRES|FEATURES per line)"),
])  # fmt: skip
def test_a_node_line_not_in_sinfos_form_is_named(line: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        node_facts(line)
    assert str(raised.value).startswith("`sinfo -h -N -a -o %R|%N|%c|%m|%G|%f`")
    assert message in str(raised.value)


def test_gpu_count_takes_ascii_digits_only() -> None:
    assert gpu_count("gpu:\u00b2") == gpu_count("gpu:\u0663") == 1  # a type name, as gpu:h100


def test_a_command_printing_bytes_that_are_not_text_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a site's wrapper in front of sinfo, printing a Latin-1 feature name
    wrappers = site_wrapper(tmp_path, "sinfo", "-h", b"batch|node1|4|1000|(null)|caf\xe9\n")
    monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
    with pytest.raises(SlurmCommandError) as raised:
        slurm_command("sinfo", "-h")
    assert str(raised.value) == ("output of `sinfo -h`: not UTF-8 text (byte 0xe9 at offset "
                                 "29): near b'|node1|4|1000|(null)|caf\\xe9'")
