"""sacct's and slurmctld's figures of a job, read: slurmctld's view of a job that sacct does
not yet have as started, as sacct's; the largest resident set of its steps; its CPU
efficiency."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcmem.slurm.accounting import (
    JobAccount,
    JobUsage,
    parse_accounting,
    parse_queue,
    parse_usage,
    sacct_elapsed,
    sacct_seconds,
)
from hpcmem.slurm.job_table import job_rows


@pytest.mark.parametrize(("shown", "written"), [
    ("0:03", "00:00:03"), ("12:34", "00:12:34"), ("1:02:03", "01:02:03"),
    ("2-01:02:03", "2-01:02:03"), ("INVALID", "INVALID"),
])
def test_squeues_elapsed_time_is_written_as_sacct_writes_it(shown, written):
    assert sacct_elapsed(shown) == written


def test_squeues_lines_become_accounts_and_others_are_left_out():
    text = "41|batch|hpc|bench|RUNNING|0:07\nnot a job line\n42|hbm|hpc|normal|PENDING|0:00\n"
    assert parse_queue(text) == {
        "41": JobAccount("41", "batch", "hpc", "bench", "RUNNING", "00:00:07", "", ""),
        "42": JobAccount("42", "hbm", "hpc", "normal", "PENDING", "00:00:00", "", ""),
    }


def test_a_jobs_use_is_its_own_cpu_time_and_its_largest_steps_max_rss():
    # as sacct prints a job and its steps: the job's line sums its steps' CPU time
    text = ("7||00:18.000|24\n7.batch|2048K|00:00.010|24\n7.extern|0|00:00:00|24\n"
            "7.0|3.5M|00:17.990|24\n8||00:00:00|0\n8.batch||00:00:00|0\n"
            "9.0|bogus|00:00:01|2\nnot a line\n")
    assert parse_usage(text) == {
        "7": JobUsage(max_rss=7 * 2**19, cpu_seconds=18.0, allocated_seconds=24.0),
        "8": JobUsage(cpu_seconds=0.0, allocated_seconds=0.0), "9": JobUsage()}
    assert parse_usage(text)["7"].cpu_efficiency == 0.75
    assert parse_usage(text)["8"].cpu_efficiency is None  # nothing allocated yet


@pytest.mark.parametrize(("shown", "seconds"), [
    ("00:01.500", 1.5), ("01:02:03", 3723.0), ("1-00:00:01", 86401.0), ("42", 42.0),
    ("", None), ("INVALID", None),
])
def test_saccts_times_read_as_seconds(shown, seconds):
    assert sacct_seconds(shown) == seconds


def test_the_job_table_shows_max_rss_and_cpu_efficiency_as_seff_does():
    line = "12|batch|hpc|normal|COMPLETED|00:00:10|0:0|run_train point=a|b\n"
    account = parse_accounting(line)["12"]
    assert account.comment == "run_train point=a|b"
    used = JobUsage(max_rss=3 * 2**20 // 2, cpu_seconds=15.0, allocated_seconds=40.0)
    row = job_rows(["12", "13"], [], {"12": replace(account, usage=used)})
    assert row[0][-2:] == ["1.5 MiB", "38%"] and row[1][-2:] == ["-", "-"]
    assert job_rows(["12"], [], {"12": account})[0][-2:] == ["-", "-"]  # nothing measured


def test_a_job_cancelled_after_writing_records_says_they_are_kept():
    cancelled = JobAccount("21", "batch", "hpc", "normal", "CANCELLED by 0", "00:00:09", "0:15",
                           "")
    accounts = {"21": cancelled, "22": replace(cancelled, job_id="22")}
    rows = job_rows(["21", "22"], [], accounts, recorded={"21"})
    assert [row[5] for row in rows] == ["CANCELLED by 0 (its records kept)", "CANCELLED by 0"]
