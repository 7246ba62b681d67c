"""slurmctld's view of a job that sacct does not yet have as started, read as sacct's."""

from __future__ import annotations

import pytest

from hpcmem.slurm.accounting import JobAccount, parse_queue, sacct_elapsed


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
