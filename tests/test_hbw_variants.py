"""hpcmem._hbw built with one backend alone: UMF without memkind, memkind without UMF.

Each variant is configured and built here with CMake (native/hbw alone, about 15 s on two
quiet cores) and loaded by tests/hbw_probe.py in place of the installed module, so a site
with only one of the two libraries is what these tests run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_hbw import REPO, check_emulated_placement, probe

from hpcmem import hbw
from hpcmem.node import topology

#: each backend, and the CMake option that leaves the other one out
VARIANTS = {"umf": "-DHPCMEM_WITH_MEMKIND=OFF", "memkind": "-DHPCMEM_WITH_UMF=OFF"}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, Path]:
    """A backend and the _hbw shared object built with that backend alone."""
    import pybind11

    name = request.param
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("cmake not found: run `make setup`")
    build = tmp_path_factory.mktemp(f"hbw-{name}")
    configure = [cmake, "-S", str(REPO / "native" / "hbw"), "-B", str(build),
                 "-G", "Unix Makefiles", f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", "-DCMAKE_BUILD_TYPE=Release",
                 VARIANTS[name]]
    configured = _run(configure)
    if f"hpcmem._hbw: backends {name} " not in configured:
        pytest.fail(f"the {name} variant did not find {name}: run `make setup`\n{configured}")
    _run([cmake, "--build", str(build), "--target", "_hbw", "-j", "2"])
    (extension,) = build.glob("_hbw*.so")
    return name, extension


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_only_that_backend_is_built(variant: tuple[str, Path]) -> None:
    name, extension = variant
    other = next(n for n in VARIANTS if n != name)
    assert probe("backend_choice", extension=extension)["backend"]["name"] == name
    error = probe("backend_choice", backend=other, extension=extension)["error"]
    assert error["type"] == "BackendNotBuiltError"
    assert error["message"].startswith(
        f"HPCMEM_HBW_BACKEND={other}: hpcmem._hbw was built with {name} only")


def test_emulated_placement(variant: tuple[str, Path]) -> None:
    if topology.hbw_nodes({}).nodes:
        pytest.skip("this machine has real HBW nodes")
    name, extension = variant
    kinds = ["dram", "hbw", "hbw_preferred", "hbw_interleave"]
    result = probe("placement", *kinds, hbw_nodes="0", extension=extension)
    assert result["built"] == [name]
    check_emulated_placement(result, kinds, name, "HPCMEM_HBW_NODES")


@pytest.mark.parametrize("kind", hbw.KINDS)
def test_constructors_every_kind(variant: tuple[str, Path], kind: str) -> None:
    _, extension = variant
    checks = probe("constructors", kind, hbw_nodes="0", dax_nodes="0", extension=extension)
    assert all(checks[n] is True for n in ("zeros", "empty", "empty_like", "owner", "aligned"))
    assert checks["kind_of"] == [kind] * 3


def test_scope_and_cycles(variant: tuple[str, Path]) -> None:
    name, extension = variant
    names = probe("scope", hbw_nodes="0", extension=extension)
    assert names["arrays"]["inner"] == [f"hpcmem_{name}_hbw", "hbw", "bind:0"]
    rss = probe("cycles", "hbw", "2000", hbw_nodes="0", extension=extension)
    assert rss["after"] - rss["before"] <= 4 << 20, rss
