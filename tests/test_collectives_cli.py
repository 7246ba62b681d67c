"""``hpcmem collectives`` in-process: every bad option, and the failure path of a wrong result."""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import subprocess
from pathlib import Path

import pytest

from hpcmem.cli import build_parser, main
from hpcmem.cli.collectives import options_from_args
from hpcmem.collectives import OPS
from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

BAD_OPTIONS = [
    (["--op", "allreduse"], "--op: 'allreduse' is not one of bcast, gather, allreduce, reduce"),
    (["--op", "bcast,bcast"], "--op: 'bcast,bcast' names an entry twice"),
    (["--buffer", "gpu"], "--buffer: 'gpu' is not one of numpy, hbw, hbw_preferred"),
    (["--dtype", "float16"], "--dtype: 'float16' is not one of float32, float64, int32, int64"),
    (["--min-size", "1.3"], "--min-size: '1.3' is not a size (accepted: a number with optional K"),
    (["--min-size", "6"], "--min-size: 6 bytes is not a positive multiple of one float32 element"),
    (["--min-size", "4", "--dtype", "int64"], "--min-size: 4 bytes is not a positive multiple"),
    (["--max-size", "lots"], "--max-size: 'lots' is not a size"),
    (["--min-size", "8K", "--max-size", "4K"], "--max-size: 4096 bytes is smaller than --min-size"),
    (["--iterations", "0"], "--iterations: '0' is not an integer >= 1"),
    (["--iterations", "ten"], "--iterations: 'ten' is not an integer >= 1"),
    (["--warmup", "-1"], "--warmup: '-1' is not an integer >= 0"),
    (["--numpy-hugepage", "yes"], "--numpy-hugepage: 'yes' is not one of on, off"),
    (["--run-id", " "], "--run-id: ' ' is blank"),
    (["--repeats", "0"], "--repeats: '0' is not an integer >= 1"),
    (["--thread-level", "any"],
     "--thread-level: 'any' is not one of single, funneled, serialized, multiple"),
    (["--native-loop", "yes"], "--native-loop: 'yes' is not one of on, off"),
    # beyond what a signed 64-bit integer holds, in one line with the range still named
    (["--max-size", "99999999999T"], "--max-size: '99999999999T' is more than 2^63 - 1, the "
     "largest size (a signed 64-bit integer); the accepted range is 4 B to 4 GiB for float32"),
    (["--min-size", "99999999999T", "--max-size", "99999999999T"],
     "--min-size: '99999999999T' is more than 2^63 - 1"),
    (["--max-size", "9" * 5000], "--max-size: '999"),  # too long to read: not a size
    # more elements than every MPI library counts
    (["--max-size", "8G"], "--max-size: '8G' is 8589934592 bytes, outside the accepted range "
     "4 B to 4 GiB for float32 (at most 2^30 elements"),
    (["--min-size", "16G", "--max-size", "16G", "--dtype", "float64"],
     "--min-size: '16G' is 17179869184 bytes, outside the accepted range 8 B to 8 GiB for "
     "float64"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_OPTIONS, ids=[a[0] for a, _ in BAD_OPTIONS])
def test_bad_option_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    output = tmp_path / "r.jsonl"
    assert main(["collectives", *argv, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("hpcmem collectives: error: ")
    assert message in err
    assert not output.exists()


def test_help_lists_ops_buffers_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["collectives", "--help"])
    text = capsys.readouterr().out
    for word in (*OPS, "hbw_interleave", "mpi_alloc", "1000", "8192", "--output", "--run-id"):
        assert word in text


def _never_writes(comm, send, recv, count, n, root, mpi):
    """A broken allreduce: returns without touching the receive buffer."""
    return lambda: None


def test_wrong_result_fails_the_point_and_the_exit_code(monkeypatch, capsys, tmp_path):
    """A collective that leaves its receive buffer unwritten is caught by the reference check."""
    monkeypatch.setitem(OPS, "allreduce", dataclasses.replace(OPS["allreduce"], bind=_never_writes))
    output = tmp_path / "r.jsonl"
    argv = ["--op", "allreduce,bcast", "--max-size", "8", "--iterations", "2", "--warmup", "0"]
    code = main(["collectives", *argv, "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 1
    assert "a result differed from its reference" in captured.err
    records = read_records(output)
    assert [(r["op"], r["size_bytes"], r["status"], r["validated"]) for r in records] == [
        ("allreduce", 4, "failed", False),
        ("allreduce", 8, "failed", False),
        ("bcast", 4, "ok", True),
        ("bcast", 8, "ok", True),
    ]
    failed = records[0]
    assert failed["reason"].startswith(
        "rank 0: allreduce: 1 of 1 elements differ from the reference"
    )
    assert "latency_us" in failed  # still measured and written
    assert all(validate_record(r) == [] for r in records)
    assert "# failed (size 4): rank 0: allreduce:" in captured.out


def test_numpy_hugepage_follows_the_option_then_the_environment(monkeypatch):
    def hugepage(*argv):
        options = options_from_args(build_parser().parse_args(["collectives", *argv]))
        return options.knobs.numpy_hugepage

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    assert hugepage() is False
    assert hugepage("--numpy-hugepage", "on") is True
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    assert hugepage() is True
    assert hugepage("--numpy-hugepage", "off") is False
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "0")
    assert hugepage() is False


def _mapped_bytes() -> int:
    """The address space this process has mapped now (``VmSize``)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmSize:\s+(\d+) kB$", status, re.MULTILINE).group(1)) << 10


@pytest.fixture
def scarce_memory():
    """This process held to the address space it has mapped plus 1 GiB while the test runs:
    a 4 GiB message, in the accepted range, is more than this "node" can allocate."""
    import mpi4py

    mpi4py.rc.thread_level = "single"
    from mpi4py import MPI  # noqa: F401  (MPI starts before the limit: it maps much)

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + (1 << 30), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize(("buffer", "why"), [
    ("numpy", "numpy: allocation failed (Unable to allocate"),
    ("mpi_alloc", "mpi_alloc: allocation failed (MPI_Alloc_mem of 4294971392 bytes: "),
])
def test_a_buffer_the_node_cannot_allocate_is_skipped_with_the_reason(buffer, why, capsys,
                                                                      tmp_path, scarce_memory):
    output = tmp_path / "r.jsonl"
    argv = ["--op", "allgather", "--buffer", buffer, "--min-size", "4G", "--max-size", "4G",
            "--iterations", "1"]
    assert main(["collectives", *argv, "--output", str(output)]) == 0
    (record,) = read_records(output)
    assert record["status"] == "skipped" and record["reason"].startswith(why)
    assert validate_record(record) == []
    assert f"# skipped: {why}" in capsys.readouterr().out


def test_missing_mpi4py_is_one_line_naming_the_install(hpcmem_exe, tmp_path):
    shadow = tmp_path / "mpi4py"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('no mpi4py in this environment')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [hpcmem_exe, "collectives", "--max-size", "8"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "mpi4py is not importable" in result.stderr and "pip install" in result.stderr


@pytest.mark.parametrize("value", ["allreduce", "allreduse:300", "allreduce:0", "bcast:x"])
def test_a_bad_injected_slowdown_is_one_line_and_exit_2(value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HPCMEM_TEST_SLOWDOWN", value)
    output = tmp_path / "r.jsonl"
    assert main(["collectives", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"HPCMEM_TEST_SLOWDOWN: {value!r} is not OP:MICROSECONDS" in err
    assert not output.exists()
