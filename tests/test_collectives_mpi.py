"""``hpcmem collectives`` under real ``mpirun -n 2``: every op x buffer kind, OSU text, records."""

from __future__ import annotations

import re
import sys

import pytest

from hpcmem import hbw
from hpcmem.collectives import BUFFER_KINDS, OPS
from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

#: how numa_maps spells each backend's hbw_preferred policy on node 0
PREFERRED = {"umf": "prefer (many):0", "memkind": "prefer:0"}

pytestmark = pytest.mark.mpi

HEADER = "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"
BARRIER_HEADER = "# Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"
ROW = re.compile(
    r"^(?P<size>\d+) *(?P<avg> +\d+\.\d\d)(?P<min> +\d+\.\d\d)(?P<max> +\d+\.\d\d)(?P<it> +\d+)$"
)
BARRIER_ROW = re.compile(
    r"^(?P<avg> +\d+\.\d\d)(?P<min> +\d+\.\d\d)(?P<max> +\d+\.\d\d)(?P<it> +\d+)$"
)
NATIVE_TITLE = "# hpcmem native loop (C, same buffers); Python overhead = Avg Latency - Native Avg"
NATIVE_ROW = re.compile(r"^# (?P<size>\d*) +(?P<native>\d+\.\d\d) +(?P<overhead>[+-]\d+\.\d\d)$")
TITLES = {
    "bcast": "Broadcast",
    "gather": "Gather",
    "allreduce": "Allreduce",
    "reduce": "Reduce",
    "allgather": "Allgather",
    "alltoall": "All-to-All Personalized Exchange",
    "scatter": "Scatter",
    "reduce_scatter": "Reduce_scatter",
    "barrier": "Barrier",
}


def tables(stdout: str) -> list[dict]:
    """Split OSU-style output into tables: title, buffer note, column header, rows, notes."""
    found: list[dict] = []
    for line in stdout.splitlines():
        if line.startswith("# OSU MPI "):
            found.append({"title": line, "lines": [], "rows": [], "notes": []})
        elif not found:
            pytest.fail(f"output before the first table: {line!r}")
        elif len(found[-1]["lines"]) < 2:
            found[-1]["lines"].append(line)
        elif line.startswith("# "):
            found[-1]["notes"].append(line)
        else:
            found[-1]["rows"].append(line)
    return found


def run_collectives(mpirun, tmp_path, *argv, env=None):
    output = tmp_path / "r.jsonl"
    result = mpirun(2, "hpcmem", "collectives", *argv, "--output", str(output), env=env)
    return result, output


def test_every_op_and_buffer_is_validated_and_formatted(mpirun, tmp_path):
    argv = ["--op", ",".join(OPS), "--buffer", ",".join(BUFFER_KINDS)]
    argv += ["--min-size", "4", "--max-size", "64", "--iterations", "3", "--warmup", "1"]
    result, output = run_collectives(mpirun, tmp_path, *argv, env={"MEMKIND_HBW_NODES": "0"})
    assert result.returncode == 0, result.stderr
    records = read_records(output)
    sizes = [4, 8, 16, 32, 64]
    assert len(records) == len(BUFFER_KINDS) * (8 * len(sizes) + 1)
    for record in records:
        assert validate_record(record) == [], record
        assert (record["status"], record["validated"], record["ranks"]) == ("ok", True, 2), record
        assert record["mpi_thread_level"] == "single"
        assert record["hbw_backend"] == hbw.backend().to_record()
        for loop in ("latency_us", "native_latency_us"):  # both loops timed every point
            assert 0 < record[loop]["min"] <= record[loop]["avg"] <= record[loop]["max"], loop
        overhead = record["latency_us"]["avg"] - record["native_latency_us"]["avg"]
        assert record["python_overhead_us"] == pytest.approx(overhead)
        assert len(record["binding"]["per_rank"]) == 2
        op = OPS[record["op"]]
        if op.sized:
            assert record["placement"]["nodes"] == {"0": record["placement"]["pages"]}
            assert record["placement"]["emulated"] is True
            expected_bus = record["algbw_GBps"] * op.bus_factor(2)
            assert record["busbw_GBps"] == pytest.approx(expected_bus)
            pages = record["placement"]["pages"]
            if record["buffer"].startswith("hbw"):
                assert record["placement"]["memkind_kinds"] == [record["buffer"]]
                preferred = PREFERRED[record["hbw_backend"]["name"]]
                policy = {"hbw": "bind:0", "hbw_preferred": preferred}.get(
                    record["buffer"], "interleave:0"
                )
                assert record["placement"]["policies"] == {policy: pages}
            elif record["buffer"] == "numpy":
                assert record["placement"]["policies"] == {"default": pages}
    assert len({r["run_id"] for r in records}) == 1

    found = tables(result.stdout)
    assert [t["title"] for t in found] == [
        f"# OSU MPI {TITLES[op]} Latency Test" for op in OPS for _ in BUFFER_KINDS
    ]
    by_point = {(r["op"], r["buffer"], r["size_bytes"]): r for r in records}
    for table, (op, kind) in zip(found, [(o, k) for o in OPS for k in BUFFER_KINDS], strict=True):
        note, header = table["lines"]
        assert note.startswith(f"# hpcmem buffer: {kind} (")
        assert header == (HEADER if OPS[op].sized else BARRIER_HEADER)
        assert len(table["rows"]) == (len(sizes) if OPS[op].sized else 1)
        for row in table["rows"]:
            match = (ROW if OPS[op].sized else BARRIER_ROW).match(row)
            assert match, row
            assert len(row) == (76 if OPS[op].sized else 65)
            record = by_point[(op, kind, int(match.groupdict().get("size", 0)))]
            assert float(match["avg"]) == pytest.approx(record["latency_us"]["avg"], abs=0.006)
            assert int(match["it"]) == record["iterations"] == 3
        title, _, *native_rows = table["notes"]  # the native loop's block follows every table
        assert title == NATIVE_TITLE and len(native_rows) == len(table["rows"])
        for row in native_rows:
            match = NATIVE_ROW.match(row)
            assert match, row
            record = by_point[(op, kind, int(match["size"] or 0))]
            assert float(match["native"]) == pytest.approx(
                record["native_latency_us"]["avg"], abs=0.006)
            assert float(match["overhead"]) == pytest.approx(
                record["python_overhead_us"], abs=0.006)


def test_acceptance_command_hbw_emulated_on_node_0(mpirun, tmp_path):
    argv = ["--op", "allreduce,bcast,gather", "--buffer", "hbw", "--max-size", "1M"]
    result, output = run_collectives(mpirun, tmp_path, *argv, env={"MEMKIND_HBW_NODES": "0"})
    assert result.returncode == 0, result.stderr
    records = read_records(output)
    assert len(records) == 3 * 19  # 4 B .. 1 MiB for float32
    for record in records:
        assert validate_record(record) == []
        assert record["validated"] is True and record["status"] == "ok"
        placement = record["placement"]
        assert placement["emulated"] is True and placement["hbw_fraction"] == 1.0
        assert set(placement["nodes"]) == {"0"} and placement["untouched"] == 0
        large = record["size_bytes"] > 8192
        assert (record["iterations"], record["warmup"]) == ((100, 10) if large else (1000, 200))
    found = tables(result.stdout)
    assert [len(t["rows"]) for t in found] == [19, 19, 19]
    assert all(t["lines"][0] == "# hpcmem buffer: hbw (emulated HBW, node 0)" for t in found)


def test_no_hbw_node_skips_hbw_and_records_numactl_binding(mpirun, tmp_path, monkeypatch):
    monkeypatch.delenv("MEMKIND_HBW_NODES", raising=False)
    argv = ["numactl", "--interleave=0", "hpcmem", "collectives", "--op", "allreduce,alltoall"]
    argv += ["--buffer", "hbw,hbw_preferred", "--max-size", "16", "--dtype", "int64"]
    argv += ["--iterations", "2", "--warmup", "0", "--output", str(tmp_path / "r.jsonl")]
    argv += ["--native-loop", "off", "--thread-level", "multiple"]
    result = mpirun(2, *argv, env={"HPCMEM_NUMACTL_ARGS": "--interleave=0"})
    assert result.returncode == 0, result.stderr
    records = read_records(tmp_path / "r.jsonl")
    statuses = {(r["op"], r["buffer"], r["size_bytes"]): r["status"] for r in records}
    assert statuses == {
        (op, kind, size): ("skipped" if kind == "hbw" else "ok")
        for op in ("allreduce", "alltoall")
        for kind in ("hbw", "hbw_preferred")
        for size in (8, 16)
    }
    for record in records:
        assert validate_record(record) == []
        for rank in record["binding"]["per_rank"]:
            assert rank["mempolicy"] == {"mode": "interleave", "nodes": [0]}
            assert rank["numactl"] == ["--interleave=0"]
        if record["status"] == "skipped":
            assert "HPCMEM_HBW_NODES" in record["reason"]
        else:  # hbw_preferred fell back to DRAM: placement says so
            assert record["mpi_thread_level"] == "multiple"
            assert "native_latency_us" not in record and "python_overhead_us" not in record
            assert record["placement"]["hbw_fraction"] is None
            assert record["placement"]["memkind_kinds"] == ["dram"]
    found = tables(result.stdout)
    skipped = [t for t in found if t["lines"][0] == "# hpcmem buffer: hbw (unavailable)"]
    assert len(skipped) == 2
    assert all(
        t["rows"] == [] and t["notes"][0].startswith("# skipped: kind 'hbw'") for t in skipped
    )
    assert all(t["notes"] == [] for t in found if t not in skipped)  # no native block


def test_bad_option_under_mpirun_reported_once(mpirun, tmp_path):
    result, output = run_collectives(mpirun, tmp_path, "--buffer", "hbm")
    assert result.returncode == 2
    message = "hpcmem collectives: error: --buffer: 'hbm' is not one of " + ", ".join(BUFFER_KINDS)
    assert (result.stdout + result.stderr).count(message) == 1
    assert not output.exists()


UNBUILT = """
import sys
sys.modules["hpcmem._timing"] = None  # as if hpcmem had been built without MPI headers
from hpcmem.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_native_loop_built_records_and_tables_say_why(mpirun, tmp_path):
    output = tmp_path / "r.jsonl"
    argv = ["collectives", "--op", "bcast", "--max-size", "8", "--iterations", "2"]
    result = mpirun(2, sys.executable, "-c", UNBUILT, *argv, "--output", str(output))
    assert result.returncode == 0, result.stderr
    records = read_records(output)
    assert [r["size_bytes"] for r in records] == [4, 8]
    for record in records:
        assert validate_record(record) == [] and record["status"] == "ok"
        assert "native_latency_us" not in record
        assert record["native_unavailable"].startswith("the native timing loop hpcmem._timing")
    (table,) = tables(result.stdout)
    assert table["notes"] == [f"# native loop unavailable: {records[0]['native_unavailable']}"]
