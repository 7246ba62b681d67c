"""hpcmem.hbw with real memkind, libnuma and the kernel's own view of each page.

memkind reads MEMKIND_HBW_NODES at start-up, so everything that depends on it runs
in a fresh interpreter (tests/hbw_probe.py) with that environment. On this
one-node machine every page is on node 0 whatever happens, so the tests also
check the memory policy the kernel records for the mapping (/proc/self/numa_maps:
``bind:0`` for hbw), which only memkind's mbind can have set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from hpcmem import _hbw, hbw
from hpcmem.node import topology
from hpcmem.results.schema import record_schema

REPO = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("hbw_probe.py")
POLICY = {"dram": "default", "hbw": "bind:0", "hbw_preferred": "prefer:0"}
POLICY["hbw_interleave"] = "interleave:0"


def probe(
    scenario: str,
    *args: str,
    hbw_nodes: str | None = None,
    dax_nodes: str | None = None,
    launcher: tuple[str, ...] = (),
):
    """Run one hbw_probe scenario in a fresh interpreter (under ``launcher``); return its JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMKIND_")}
    if hbw_nodes is not None:
        env["MEMKIND_HBW_NODES"] = hbw_nodes
    if dax_nodes is not None:
        env["MEMKIND_DAX_KMEM_NODES"] = dax_nodes
    done = subprocess.run(
        [*launcher, sys.executable, str(PROBE), scenario, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def no_hbw_machine() -> None:
    if topology.hbw_nodes({}).nodes:
        pytest.skip("this machine has real HBW nodes")


def _placement_schema() -> dict[str, Any]:
    collectives = next(
        part["then"]
        for part in record_schema()["allOf"]
        if part["if"]["properties"].get("benchmark") == {"const": "collectives"}
    )
    return collectives["properties"]["placement"]


def test_emulated_hbw_every_page_on_node0(no_hbw_machine: None) -> None:
    kinds = ["dram", "hbw", "hbw_preferred", "hbw_interleave"]
    result = probe("placement", *kinds, hbw_nodes="0")
    for kind in kinds:
        got = result[kind]
        record = got["record"]
        assert got["untouched_before_write"] == got["expected_pages"], kind  # empty: not placed
        assert record["pages"] == got["expected_pages"] and record["untouched"] == 0
        assert record["nodes"] == {"0": got["expected_pages"]}
        assert record["hbw_fraction"] == 1.0 and record["emulated"] is True
        assert record["source"] == "MEMKIND_HBW_NODES" and record["hbw_nodes"] == [0]
        assert record["kind"] == got["kind_of"] == kind
        assert got["verify"] is True  # memkind's hbw_verify_memory_region agrees
        assert got["policy"] == POLICY[kind]  # the kernel saw memkind's mbind
        assert record["policies"] == {POLICY[kind]: record["pages"]}  # and placement says so
        assert sum(got["plain_policies"].values()) > 0
        assert set(got["plain_policies"]) == {"default"}
        jsonschema.validate(record, _placement_schema())


def test_policies_follow_numactl() -> None:
    """Under numactl --membind, plain and dram pages report the thread's bind policy."""
    if shutil.which("numactl") is None:
        pytest.fail("numactl not found: run `make setup`")
    result = probe(
        "placement", "dram", "hbw_preferred", hbw_nodes="0", launcher=("numactl", "--membind=0")
    )
    assert result["dram"]["policy"] == "bind:0"  # numa_maps
    assert result["dram"]["record"]["policies"] == {"bind:0": result["dram"]["expected_pages"]}
    assert set(result["dram"]["plain_policies"]) == {"bind:0"}
    assert set(result["hbw_preferred"]["record"]["policies"]) == {"prefer:0"}  # memkind's own


def test_without_hbw_nodes(no_hbw_machine: None) -> None:
    result = probe("unavailable")
    for kind in ("hbw", "hbw_interleave"):
        error = result[kind]
        assert error["type"] == "HBWUnavailableError" and "RuntimeError" in error["mro"]
        assert error["message"].startswith(f"kind '{kind}': no high-bandwidth NUMA node")
        assert "MEMKIND_HBW_NODES" in error["message"] and "hbw_preferred" in error["message"]
    assert result["allocator_hbw"]["type"] == "HBWUnavailableError"
    assert result["handler_unchanged"]
    assert result["dax_kmem"]["type"] == "KindUnavailableError"
    assert "MEMKIND_DAX_KMEM_NODES" in result["dax_kmem"]["message"]

    preferred = result["hbw_preferred"]
    assert [w[0] for w in preferred["warnings"]] == ["HBWFallbackWarning"] * 2
    assert all(w[2] == str(PROBE) for w in preferred["warnings"])  # points at the caller
    assert "memory comes from DRAM" in preferred["warnings"][0][1]
    record = preferred["record"]
    assert record["kind"] == "dram" and record["hbw_fraction"] is None
    assert record["emulated"] is False and record["source"] == "none"
    assert sum(record["nodes"].values()) == record["pages"] > 0
    assert preferred["served_in_scope"] == "dram"
    assert preferred["scoped_handler"] == "hpcmem_memkind_dram"
    assert preferred["policy"] == "default"
    assert record["policies"] == {"default": record["pages"]}


@pytest.mark.parametrize("kind", hbw.KINDS)
def test_constructors_every_kind(kind: str) -> None:
    checks = probe("constructors", kind, hbw_nodes="0", dax_nodes="0")
    for name in ("zeros", "empty", "empty_like", "writeable", "owner", "aligned"):
        assert checks[name] is True, name
    assert checks["kind_of"] == [kind] * 3
    assert checks["zero_size"] == [[[0], 0], [[0, 3], 0], [[2, 0], 0]]


def test_allocator_scope() -> None:
    names = probe("scope", hbw_nodes="0")
    assert names["default"] == "default_allocator"
    assert names["inner_scope"] == "hpcmem_memkind_hbw"
    assert names["other_thread"] == "default_allocator"  # the handler is per context
    assert names["after_inner"] == "hpcmem_memkind_dram"
    assert names["after_outer"] == names["after_exception"] == "default_allocator"
    arrays = names["arrays"]
    assert arrays["outer"] == ["hpcmem_memkind_dram", "dram", "default"]
    assert arrays["inner"] == ["hpcmem_memkind_hbw", "hbw", "bind:0"]
    assert arrays["after_inner"] == "hpcmem_memkind_dram"
    assert arrays["plain"] == "default_allocator"
    assert arrays["inner_placement"]["hbw_fraction"] == 1.0
    assert arrays["inner_placement"]["kind"] == "hbw"


def test_allocator_scope_in_process() -> None:
    before = hbw.handler_name()
    with hbw.allocator("dram") as served:
        made = np.arange(100_000, dtype=np.float64) * 2
        assert hbw.handler_name() == "hpcmem_memkind_dram"
    assert served == "dram" and hbw.handler_name() == before
    assert hbw.handler_name(made) == "hpcmem_memkind_dram" and hbw.kind_of(made) == "dram"
    assert made[-1] == 199_998.0
    with pytest.raises(ZeroDivisionError), hbw.allocator("dram"):
        _ = 1 / 0
    assert hbw.handler_name() == before
    assert hbw.handler_name(np.ones(3)) == before


def test_leak_free_cycles() -> None:
    """10,000 allocate/free cycles (64 KiB buffers + NEP-49 arrays): RSS stays flat.

    A leak of one buffer per cycle would add 640 MiB.
    """
    rss = probe("cycles", "hbw", "10000", hbw_nodes="0")
    assert rss["after"] - rss["before"] <= 4 << 20, rss


@pytest.mark.parametrize("call", ["empty", "zeros", "empty_like", "allocator", "resolve_kind"])
def test_unknown_kind(call: str) -> None:
    message = "kind 'mcdram' is not one of dram, hbw, hbw_preferred, hbw_interleave, dax_kmem"
    calls = {
        "empty": lambda: hbw.empty(4, kind="mcdram"),
        "zeros": lambda: hbw.zeros(4, kind="mcdram"),
        "empty_like": lambda: hbw.empty_like(np.ones(4), kind="mcdram"),
        "allocator": lambda: hbw.allocator("mcdram").__enter__(),
        "resolve_kind": lambda: hbw.resolve_kind("mcdram"),
    }
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        calls[call]()


def test_native_unknown_kind() -> None:
    assert _hbw.KINDS == hbw.KINDS  # one list of kinds from C++ to Python
    with pytest.raises(ValueError, match=r"^kind 'x' is not one of dram, hbw, "):
        _hbw.Buffer("x", 8)


def test_failed_allocation_names_bytes() -> None:
    size = 1 << 50  # 1 PiB: beyond any address space memkind can map here
    with pytest.raises(MemoryError, match=rf"^memkind kind 'dram': cannot allocate {size} bytes$"):
        hbw.empty(size, np.uint8, kind="dram")
    with pytest.raises(MemoryError, match=r"cannot allocate 9671406556917033397649408 bytes"):
        hbw.empty((1 << 40, 1 << 40), np.float64, kind="dram")


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (((-1, 2),), ValueError, r"^shape \(-1, 2\): negative dimensions are not allowed$"),
        ((2.5,), TypeError, r"^shape 2.5: dimensions must be integers$"),
        ((3, object), ValueError, r"^dtype object: arrays of Python objects cannot live"),
    ],
)
def test_bad_arguments(args: tuple, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        hbw.empty(*args, kind="dram")
    with pytest.raises(ValueError, match=r"^order 'K' is not one of C, F$"):
        hbw.zeros(3, kind="dram", order="K")


def test_placement_of_plain_numpy_arrays() -> None:
    page = _hbw.page_size()
    # above glibc's largest mmap threshold (32 MiB): a fresh mapping, not freed heap memory
    # that earlier tests touched; nothing touched yet
    fresh = np.empty(40 << 20, dtype=np.uint8)
    untouched = hbw.placement(fresh)
    fresh[:] = 1
    touched = hbw.placement(fresh)
    expected = (fresh.ctypes.data % page + fresh.nbytes + page - 1) // page
    assert untouched.pages == touched.pages == expected
    assert untouched.untouched >= expected - 1  # malloc's header may share the first page
    node_ids = {n.id for n in topology.numa_nodes()}
    assert touched.untouched == 0 and set(touched.nodes) <= node_ids
    assert sum(touched.nodes.values()) == expected and touched.kind is None
    assert sum(touched.policies.values()) == expected
    backwards = fresh[::-1]  # negative stride: the same pages
    assert hbw.placement(backwards).pages == expected
    assert hbw.placement(fresh[:0]).pages == 0 and hbw.placement(fresh[:0]).hbw_fraction is None


def test_placement_of_mpi_alloc_mem() -> None:
    """An array over MPI.Alloc_mem memory (a singleton MPI process, real Open MPI)."""
    from conftest import mpi_environment

    env = {k: v for k, v in mpi_environment().items() if not k.startswith("MEMKIND_")}
    done = subprocess.run(
        [sys.executable, str(PROBE), "mpi_alloc"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["record"]["pages"] == result["expected_pages"]
    assert sum(result["record"]["nodes"].values()) == result["expected_pages"]
    assert result["record"]["kind"] is None


def test_memkind_version_matches_pkg_config() -> None:
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config not installed")
    out = subprocess.run(["pkg-config", "--modversion", "memkind"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert hbw.memkind_version() == out.stdout.strip()


def test_not_built_error_path() -> None:
    """With hpcmem._hbw unimportable, every entry point says how to install memkind."""
    result = probe("not_built")
    for name in ("empty", "zeros", "allocator", "placement", "memkind_version"):
        error = result[name]
        assert error["type"] == "MemkindNotBuiltError", name
        assert "KindUnavailableError" in error["mro"] and "RuntimeError" in error["mro"]
        assert "apt-get install libmemkind-dev" in error["message"]
        assert "rebuild" in error["message"] and "make native" in error["message"]
    assert result["kind_of"] is None
    assert result["unknown_kind"]["type"] == "ValueError"


def test_cmake_without_memkind(tmp_path: Path) -> None:
    """Configuring with memkind missing warns clearly, succeeds, and defines no _hbw."""
    import pybind11

    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("cmake not found: run `make setup`")
    done = subprocess.run(
        [
            cmake,
            "-S",
            str(REPO / "native"),
            "-B",
            str(tmp_path),
            "-G",
            "Unix Makefiles",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DMEMKIND_LIBRARY=/nonexistent/libmemkind.so",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    warning = " ".join(done.stderr.split())
    assert "hpcmem._hbw is NOT built: memkind or libnuma not found" in warning
    assert "apt-get install libmemkind-dev libnuma-dev" in warning
    assert "_hbw" not in (tmp_path / "Makefile").read_text()
