"""Unit tests of the collectives pieces: sizes, references, the validator, OSU text, placement."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from hpcmem.collectives import osu
from hpcmem.collectives.benchmark import exit_code
from hpcmem.collectives.ops import OPS, SENTINEL, check, rank_input, split_counts
from hpcmem.collectives.placement import describe, merge_placements
from hpcmem.collectives.sizes import osu_counts, size_steps
from hpcmem.collectives.timing import Latency
from hpcmem.node import applied

# osu_allreduce -f, OSU 7.x: the column header byte for byte
OSU_HEADER = "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"
OSU_BARRIER_HEADER = "# Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"


def test_size_steps_double_up_to_max():
    assert size_steps(8, 64) == [8, 16, 32, 64]
    assert size_steps(4, 100) == [4, 8, 16, 32, 64]
    with pytest.raises(ValueError):
        size_steps(64, 8)


def test_osu_iteration_defaults_switch_above_8k():
    assert osu_counts(8192, None, None) == (1000, 200)
    assert osu_counts(16384, None, None) == (100, 10)
    assert osu_counts(16384, 7, 0) == (7, 0)


def test_rank_inputs_differ_between_ranks_and_positions():
    a, b = rank_input(0, 4096, np.int64), rank_input(1, 4096, np.int64)
    assert a.min() >= 1 and a.max() <= 8191
    assert not np.array_equal(a, b)
    assert len(np.unique(a[:4096])) == 4096


def test_sums_over_2048_ranks_stay_exact_in_float32():
    ranks, count = 2048, 1024
    total = np.zeros(count, np.float32)
    for rank in range(ranks):
        total += rank_input(rank, count, np.float32)
    expected = OPS["allreduce"].reference(count, ranks, 0, 0)
    assert check("allreduce", total, expected) is None


def test_split_counts_cover_the_vector():
    assert split_counts(5, 2) == [3, 2]
    assert split_counts(1, 3) == [1, 0, 0]
    assert sum(split_counts(1000, 7)) == 1000


def test_references_by_hand_for_two_ranks():
    r0, r1 = rank_input(0, 4, np.int64), rank_input(1, 4, np.int64)
    np.testing.assert_array_equal(OPS["allreduce"].reference(4, 2, 1, 0), r0 + r1)
    np.testing.assert_array_equal(OPS["gather"].reference(4, 2, 0, 0), np.concatenate([r0, r1]))
    assert OPS["gather"].reference(4, 2, 1, 0) is None
    assert OPS["reduce"].reference(4, 2, 1, 0) is None
    np.testing.assert_array_equal(OPS["bcast"].reference(4, 2, 1, 0), r0)
    s0, s1 = rank_input(0, 8, np.int64), rank_input(1, 8, np.int64)
    np.testing.assert_array_equal(OPS["alltoall"].reference(4, 2, 1, 0), np.r_[s0[4:], s1[4:]])
    np.testing.assert_array_equal(OPS["scatter"].reference(4, 2, 1, 0), s0[4:])
    np.testing.assert_array_equal(OPS["reduce_scatter"].reference(4, 2, 1, 0), (r0 + r1)[2:])


def test_check_accepts_the_reference_in_every_dtype():
    for dtype in ("float32", "float64", "int32", "int64"):
        expected = OPS["allreduce"].reference(64, 4, 0, 0)
        assert check("allreduce", expected.astype(dtype), expected) is None


def test_check_names_a_wrong_element():
    expected = OPS["allreduce"].reference(16, 2, 0, 0)
    result = expected.astype(np.float32)
    result[5] += 1
    reason = check("allreduce", result, expected)
    assert reason is not None
    assert "1 of 16 elements differ" in reason and "index 5" in reason


def test_check_catches_an_unwritten_receive_buffer():
    expected = OPS["gather"].reference(8, 2, 0, 0)
    untouched = np.full(expected.shape, SENTINEL, np.float32)
    assert "16 of 16 elements differ" in check("gather", untouched, expected)


def test_check_catches_a_wrong_shape_and_a_missing_result():
    expected = OPS["allgather"].reference(4, 2, 0, 0)
    assert "shape" in check("allgather", expected[:4].astype(np.float32), expected)
    assert "shape" in check("allgather", None, expected)


def test_bus_factors_follow_nccl_tests():
    n = 4
    assert OPS["allreduce"].bus_factor(n) == pytest.approx(1.5)
    for name in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        assert OPS[name].bus_factor(n) == pytest.approx(0.75)
    assert OPS["bcast"].bus_factor(n) == OPS["reduce"].bus_factor(n) == 1.0
    assert OPS["allgather"].data_bytes(1024, n) == 4096
    assert OPS["allreduce"].data_bytes(1024, n) == 1024
    assert OPS["barrier"].data_bytes(1024, n) == 0


def test_osu_columns_match_osu_full_output():
    latency = Latency(avg=1.234, min=0.5, max=12345.678)
    assert osu.column_header(OPS["allreduce"]) == OSU_HEADER
    assert osu.column_header(OPS["barrier"]) == OSU_BARRIER_HEADER
    assert osu.row(OPS["allreduce"], 1048576, latency, 100) == (
        "1048576" + " " * 3 + f"{'1.23':>18}{'0.50':>18}{'12345.68':>18}{'100':>12}"
    )
    assert (
        osu.row(OPS["barrier"], 0, latency, 1000)
        == f"{'1.23':>17}{'0.50':>18}{'12345.68':>18}{'1000':>12}"
    )
    title, note, header = osu.header_lines(OPS["allreduce"], "hbw (emulated HBW, node 0)")
    assert title == "# OSU MPI Allreduce Latency Test"
    assert note == "# hpcmem buffer: hbw (emulated HBW, node 0)"
    assert header == OSU_HEADER


def test_merge_placements_weights_pages_across_buffers():
    a = {"hbw_fraction": 1.0, "nodes": {"1": 3}, "emulated": False, "hbw_nodes": [1], "pages": 3}
    b = {"hbw_fraction": 0.0, "nodes": {"0": 1}, "emulated": False, "hbw_nodes": [1], "pages": 1}
    merged = merge_placements([a, None, b])
    assert merged["hbw_fraction"] == pytest.approx(0.75)
    assert merged["nodes"] == {"0": 1, "1": 3}
    assert merged["buffers"] == 2
    assert describe("hbw_preferred", merged, {}) == "hbw_preferred (75% HBW, nodes 0,1)"
    assert merge_placements([])["hbw_fraction"] is None


def test_exit_code_only_fails_on_failed_points():
    assert exit_code([{"status": "ok"}, {"status": "skipped"}]) == 0
    assert exit_code([{"status": "ok"}, {"status": "failed"}]) == 1


def test_affinity_reads_the_kernel():
    binding = applied.current()
    assert binding["cpus"] == sorted(os.sched_getaffinity(0))
    assert binding["mempolicy"]["mode"] in applied.MEMPOLICY_MODES.values()


def test_affinity_sees_numactl_binding():
    code = "import json; from hpcmem.node import applied; print(json.dumps(applied.current()))"
    out = subprocess.run(
        ["numactl", "--interleave=0", "--physcpubind=0", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            applied.NUMACTL_ENV: "--interleave=0 --physcpubind=0",
            applied.BINDING_ENV: "interleave",
        },
    ).stdout
    assert re.search(r'"mode": "interleave", "nodes": \[0\]', out)
    assert '"cpus": [0]' in out
    assert '"numactl": ["--interleave=0", "--physcpubind=0"]' in out
    assert '"name": "interleave"' in out


def test_timing_loop_counts_only_timed_calls_and_times_each():
    import time

    from mpi4py import MPI

    from hpcmem.collectives.timing import across_ranks, rank_latency

    calls = []

    def call():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    seconds = rank_latency(MPI.COMM_SELF, call, iterations=4, warmup=3)
    assert len(calls) == 7
    assert 0.002 <= seconds < 0.02
    latency = across_ranks(MPI.COMM_SELF, seconds)
    assert latency.avg == latency.min == latency.max == pytest.approx(seconds * 1e6)


@pytest.mark.parametrize("kind", ["numpy", "hbw_preferred"])
def test_buffers_start_on_a_page_boundary_as_osu_posix_memalign(kind):
    from contextlib import ExitStack

    from hpcmem.collectives import buffers

    with ExitStack() as stack:
        for length in (1, 1000, 1 << 18):
            array = buffers.allocate(kind, length, np.float32, stack)
            assert array.ctypes.data % buffers.PAGE_SIZE == 0
            assert (array.shape, array.dtype, array.flags.writeable) == ((length,), "float32", True)
            array[:] = rank_input(1, length, np.float32)  # all of it is usable memory
            assert array[-1] == rank_input(1, length)[-1]


def test_native_loop_is_built_here_and_says_why_when_not(monkeypatch):
    from hpcmem.collectives import native

    assert native.unavailable() is None  # make setup builds it against Open MPI and mpi4py
    monkeypatch.setitem(sys.modules, "hpcmem._timing", None)  # as if built without MPI
    why = native.unavailable()
    assert why.startswith("the native timing loop hpcmem._timing is not built")
    assert "apt-get install libopenmpi-dev" in why and "make native" in why
