"""hpcmem.hbw with each built-in backend (UMF, memkind), libnuma and the kernel's own view.

The backend is configured once per process (memkind reads MEMKIND_HBW_NODES at start-up
too), so everything that depends on it runs in a fresh interpreter (tests/hbw_probe.py)
with that environment, once per backend built in (HPCMEM_HBW_BACKEND). On this one-node
machine every page is on node 0 whatever happens, so the tests also check the memory
policy the kernel records for the mapping (/proc/self/numa_maps: ``bind:0`` for hbw), which
only the backend's mbind can have set. tests/test_hbw_variants.py builds each backend alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
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
#: the kernel's policy of each kind on node 0 (numa_maps' first word): UMF's preferred kind
#: is MPOL_PREFERRED_MANY, which numa_maps spells "prefer (many):0"
NUMA_MAPS = {"dram": "default", "hbw": "bind:0", "hbw_interleave": "interleave:0"}
PREFERRED = {"umf": ("prefer", "prefer (many):0"), "memkind": ("prefer:0", "prefer:0")}
#: the variables a probe starts without: each test sets the ones it means
CLEARED = ("MEMKIND_", "HPCMEM_HBW_", "HPCMEM_DAX_")


def probe(
    scenario: str,
    *args: str,
    backend: str | None = None,
    hbw_nodes: str | None = None,
    dax_nodes: str | None = None,
    variable: str = "HPCMEM_HBW_NODES",
    launcher: tuple[str, ...] = (),
    extension: Path | None = None,
):
    """Run one hbw_probe scenario in a fresh interpreter (under ``launcher``); return its JSON.

    ``backend`` picks the backend, ``hbw_nodes`` is declared through ``variable``,
    ``extension`` is a one-backend build of _hbw to load instead of the installed one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    for name, value in (("HPCMEM_HBW_BACKEND", backend), (variable, hbw_nodes),
                        ("HPCMEM_DAX_KMEM_NODES", dax_nodes), ("HPCMEM_HBW_EXTENSION", extension)):
        if value is not None:
            env[name] = str(value)
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


@pytest.fixture(params=_hbw.BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend built into the installed hpcmem._hbw."""
    return request.param


@pytest.fixture(scope="module")
def no_hbw_machine() -> None:
    if topology.hbw_nodes({}).nodes:
        pytest.skip("this machine has real HBW nodes")


def policy(kind: str, backend: str) -> tuple[str, str]:
    """The kind's policy on node 0 as numa_maps' first word, and as hbw.placement spells it."""
    if kind == "hbw_preferred":
        return PREFERRED[backend]
    return NUMA_MAPS[kind], NUMA_MAPS[kind]


def check_emulated_placement(result: dict[str, Any], kinds: list[str], backend: str,
                             source: str) -> None:
    """Every page of every kind on node 0, declared HBW by ``source``, as ``backend`` put it."""
    assert result["backend"]["name"] == backend
    for kind in kinds:
        got = result[kind]
        record = got["record"]
        assert got["untouched_before_write"] == got["expected_pages"], kind  # empty: not placed
        assert record["pages"] == got["expected_pages"] and record["untouched"] == 0
        assert record["nodes"] == {"0": got["expected_pages"]}
        assert record["hbw_fraction"] == 1.0 and record["emulated"] is True
        assert record["source"] == source and record["hbw_nodes"] == [0]
        assert record["kind"] == got["kind_of"] == kind
        assert got["verify"] is True  # the backend's own check agrees
        in_maps, in_record = policy(kind, backend)
        assert got["policy"] == in_maps  # the kernel saw the backend's mbind
        assert record["policies"] == {in_record: record["pages"]}  # and placement says so
        assert sum(got["plain_policies"].values()) > 0
        assert set(got["plain_policies"]) == {"default"}
        jsonschema.validate(record, _placement_schema())


def _placement_schema() -> dict[str, Any]:
    collectives = next(
        part["then"]
        for part in record_schema()["allOf"]
        if part["if"]["properties"].get("benchmark") == {"const": "collectives"}
    )
    return collectives["properties"]["placement"]


def test_emulated_hbw_every_page_on_node0(no_hbw_machine: None, backend: str) -> None:
    kinds = ["dram", "hbw", "hbw_preferred", "hbw_interleave"]
    result = probe("placement", *kinds, backend=backend, hbw_nodes="0")
    check_emulated_placement(result, kinds, backend, "HPCMEM_HBW_NODES")


def test_memkind_variable_declares_for_every_backend(no_hbw_machine: None, backend: str) -> None:
    """MEMKIND_HBW_NODES, which the workflow's emulation sets, is honoured by UMF too."""
    result = probe("placement", "hbw", backend=backend, hbw_nodes="0",
                   variable="MEMKIND_HBW_NODES")
    check_emulated_placement(result, ["hbw"], backend, "MEMKIND_HBW_NODES")


def test_policies_follow_numactl(backend: str) -> None:
    """Under numactl --membind, plain and dram pages report the thread's bind policy."""
    if shutil.which("numactl") is None:
        pytest.fail("numactl not found: run `make setup`")
    result = probe("placement", "dram", "hbw_preferred", backend=backend, hbw_nodes="0",
                   launcher=("numactl", "--membind=0"))
    assert result["dram"]["policy"] == "bind:0"  # numa_maps
    assert result["dram"]["record"]["policies"] == {"bind:0": result["dram"]["expected_pages"]}
    assert set(result["dram"]["plain_policies"]) == {"bind:0"}
    preferred = policy("hbw_preferred", backend)[1]
    assert set(result["hbw_preferred"]["record"]["policies"]) == {preferred}  # the backend's


def test_without_hbw_nodes(no_hbw_machine: None, backend: str) -> None:
    result = probe("unavailable", backend=backend)
    for kind in ("hbw", "hbw_interleave"):
        error = result[kind]
        assert error["type"] == "HBWUnavailableError" and "RuntimeError" in error["mro"]
        assert error["message"].startswith(f"kind '{kind}': no high-bandwidth NUMA node")
        assert f"({backend} error " in error["message"]
        assert "HPCMEM_HBW_NODES" in error["message"] and "hbw_preferred" in error["message"]
    assert result["allocator_hbw"]["type"] == "HBWUnavailableError"
    assert result["handler_unchanged"]
    assert result["dax_kmem"]["type"] == "KindUnavailableError"
    assert "HPCMEM_DAX_KMEM_NODES" in result["dax_kmem"]["message"]

    preferred = result["hbw_preferred"]
    assert [w[0] for w in preferred["warnings"]] == ["HBWFallbackWarning"] * 2
    assert all(w[2] == str(PROBE) for w in preferred["warnings"])  # points at the caller
    assert "memory comes from DRAM" in preferred["warnings"][0][1]
    record = preferred["record"]
    assert record["kind"] == "dram" and record["hbw_fraction"] is None
    assert record["emulated"] is False and record["source"] == "none"
    assert sum(record["nodes"].values()) == record["pages"] > 0
    assert preferred["served_in_scope"] == "dram"
    assert preferred["scoped_handler"] == f"hpcmem_{backend}_dram"
    assert preferred["policy"] == "default"
    assert record["policies"] == {"default": record["pages"]}


@pytest.mark.parametrize("kind", hbw.KINDS)
def test_constructors_every_kind(kind: str, backend: str) -> None:
    checks = probe("constructors", kind, backend=backend, hbw_nodes="0", dax_nodes="0")
    for name in ("zeros", "empty", "empty_like", "writeable", "owner", "aligned"):
        assert checks[name] is True, name
    assert checks["kind_of"] == [kind] * 3
    assert checks["zero_size"] == [[[0], 0], [[0, 3], 0], [[2, 0], 0]]


def test_allocator_scope(backend: str) -> None:
    names = probe("scope", backend=backend, hbw_nodes="0")
    assert names["default"] == "default_allocator"
    assert names["inner_scope"] == f"hpcmem_{backend}_hbw"
    assert names["other_thread"] == "default_allocator"  # the handler is per context
    assert names["after_inner"] == f"hpcmem_{backend}_dram"
    assert names["after_outer"] == names["after_exception"] == "default_allocator"
    arrays = names["arrays"]
    assert arrays["outer"] == [f"hpcmem_{backend}_dram", "dram", "default"]
    assert arrays["inner"] == [f"hpcmem_{backend}_hbw", "hbw", "bind:0"]
    assert arrays["after_inner"] == f"hpcmem_{backend}_dram"
    assert arrays["plain"] == "default_allocator"
    assert arrays["inner_placement"]["hbw_fraction"] == 1.0
    assert arrays["inner_placement"]["kind"] == "hbw"


def test_allocator_scope_in_process() -> None:
    before = hbw.handler_name()
    dram = f"hpcmem_{hbw.backend().name}_dram"
    with hbw.allocator("dram") as served:
        made = np.arange(100_000, dtype=np.float64) * 2
        assert hbw.handler_name() == dram
    assert served == "dram" and hbw.handler_name() == before
    assert hbw.handler_name(made) == dram and hbw.kind_of(made) == "dram"
    assert made[-1] == 199_998.0
    with pytest.raises(ZeroDivisionError), hbw.allocator("dram"):
        _ = 1 / 0
    assert hbw.handler_name() == before
    assert hbw.handler_name(np.ones(3)) == before


def test_leak_free_cycles(backend: str) -> None:
    """10,000 allocate/free cycles (64 KiB buffers + NEP-49 arrays): RSS stays flat.

    A leak of one buffer per cycle would add 640 MiB.
    """
    rss = probe("cycles", "hbw", "10000", backend=backend, hbw_nodes="0")
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
    size = 1 << 50  # 1 PiB: beyond any address space the backend can map here
    name = hbw.backend().name
    with pytest.raises(MemoryError, match=rf"^{name} kind 'dram': cannot allocate {size} bytes$"):
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
    assert fresh.sum() == 0  # read only: the kernel's shared zero pages (NumPy asks for huge)
    read = hbw.placement(fresh)
    fresh[:] = 1
    touched = hbw.placement(fresh)
    expected = (fresh.ctypes.data % page + fresh.nbytes + page - 1) // page
    assert untouched.pages == read.pages == touched.pages == expected
    assert untouched.untouched >= expected - 1  # malloc's header may share the first page
    assert read.untouched >= expected - 1  # zero pages are no node's
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


def test_backend_versions(backend: str) -> None:
    """Each backend names the release it runs with: pip's umf, pkg-config's memkind."""
    found = probe("backend_choice", backend=backend)["backend"]
    got = {key: found[key] for key in ("name", "version")}
    if backend == "umf":
        assert got == {"name": "umf", "version": metadata.version("umf")}
        return
    assert found["highest_bandwidth"] is None  # memkind ranks no nodes
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config not installed")
    out = subprocess.run(["pkg-config", "--modversion", "memkind"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert got == {"name": "memkind", "version": out.stdout.strip()}


def test_default_backend_is_the_first_built() -> None:
    assert probe("backend_choice")["backend"]["name"] == _hbw.BACKENDS[0]
    assert _hbw.BACKENDS[0] == "umf" or "umf" not in _hbw.BACKENDS  # UMF first where built


def test_backend_choice_refused() -> None:
    error = probe("backend_choice", backend="jemalloc")["error"]
    assert error["type"] == "BackendChoiceError" and "ValueError" in error["mro"]
    assert error["message"] == "HPCMEM_HBW_BACKEND='jemalloc' is not one of umf, memkind"


def test_not_built_error_path() -> None:
    """With hpcmem._hbw unimportable, every entry point says how to install a backend."""
    result = probe("not_built")
    for name in ("empty", "zeros", "allocator", "placement", "backend"):
        error = result[name]
        assert error["type"] == "BackendNotBuiltError", name
        assert "KindUnavailableError" in error["mro"] and "RuntimeError" in error["mro"]
        assert "pip install umf" in error["message"]
        assert "apt-get install libmemkind-dev" in error["message"]
        assert "rebuild" in error["message"] and "make native" in error["message"]
    assert result["kind_of"] is None
    assert result["unknown_kind"]["type"] == "ValueError"


def test_cmake_without_any_backend(tmp_path: Path) -> None:
    """Configuring with neither UMF nor memkind warns clearly, succeeds, and defines no _hbw."""
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
            "-DHPCMEM_WITH_UMF=OFF",
            "-DMEMKIND_LIBRARY=/nonexistent/libmemkind.so",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    warning = " ".join(done.stderr.split())
    assert "hpcmem._hbw is NOT built: no placement backend (UMF or memkind)" in warning
    assert "pip install umf" in warning and "apt-get install libmemkind-dev libnuma-dev" in warning
    assert "_hbw" not in (tmp_path / "Makefile").read_text()
