"""Pytest plugin: the container runtime, and the one CPU image the suite builds.

``apptainer`` is the runtime on PATH; without one, the tests that need it are skipped saying
how to get one (``make test`` as root runs the installer HPCMEM_APPTAINER_INSTALLER names).
``cpu_image`` is the CPU image on Debian 13 (another release than this Debian 12 host: Python
3.13, Open MPI 5), built through the workflow's own build_container rule with pip reading
only a wheelhouse the session makes (``pip download`` for the image's Python, then
``--no-index`` in the build; ``make_wheelhouse``). It is kept in IMAGE_CACHE across sessions,
keyed by what it is made of (definition, build arguments, source tree, wheelhouse content),
so a session builds it only when one of those changed; the build (or the cache hit) starts
before the first test and runs alongside the others. ``without_runtime`` runs a command on a
host that has no runtime: in a mount namespace where every runtime on PATH is masked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hpcmem.workflow.containers import (
    RELEASES,
    RUNTIMES,
    ImageRef,
    download_wheels,
    find_runtime,
)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: a Debian mirror that refuses connections at once: the CPU image cannot be built
NO_MIRROR = "http://127.0.0.1:9/debian"
#: where the suite's image is kept between sessions (outside the checkout, as OSU_DIR is)
IMAGE_CACHE = Path(os.environ.get("HPCMEM_IMAGE_CACHE",
                                  Path.home() / ".cache" / "hpcmem" / "images"))  # fmt: skip
#: the suite's image: Debian 13 and its Python, on this Debian 12 host
IMAGE_DEBIAN = "trixie"
IMAGE_PYTHON = RELEASES[IMAGE_DEBIAN][0]
RUNTIME_MISSING = (
    "needs Apptainer on PATH: `make test` as root installs it when HPCMEM_APPTAINER_INSTALLER "
    "names an installer; elsewhere install Apptainer >= 1.2"
)

__all__ = ["IMAGE_DEBIAN", "IMAGE_PYTHON", "NO_MIRROR", "BuiltImage", "host_open_mpi",
           "image_settings", "leftovers", "make_wheelhouse", "snakemake", "snakemake_process",
           "without_runtime", "workdir_with"]


def without_runtime(command: Sequence[str]) -> list[str]:
    """``command`` run where ``apptainer`` and ``singularity`` cannot be found: each one on
    PATH is covered by /dev/null (not executable) in a private mount namespace."""
    found = {os.path.realpath(p) for p in (shutil.which(n) for n in RUNTIMES) if p}
    masks = "".join(f"mount --bind /dev/null '{path}' && " for path in sorted(found))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'{masks}exec "$@"', "sh", *command]  # fmt: skip


def host_open_mpi() -> str:
    """This host's Open MPI version (4.1.4 on Debian 12)."""
    out = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True).stdout
    return re.search(r"Open MPI v([\d.]+)", out)[1]


def leftovers(folder: Path) -> list[str]:
    """What a build left in the image folder, besides its lock files."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def workdir_with(folder: Path, **sections: dict) -> Path:
    """``folder`` with a copy of the tests' tiny config, its sections updated."""
    shutil.copytree(REPO / ".test" / "config", folder / "config")
    path = folder / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config))
    return folder


def snakemake_process(workdir: Path, *args: str, profile: Path = REPO / "profiles" / "local",
                      wrap=list, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """The workflow in ``workdir``, started (``wrap`` wraps the command line)."""
    snakefile = REPO / "workflow" / "Snakefile"
    command = [str(BIN / "snakemake"), "--profile", str(profile), "--snakefile", str(snakefile),
               "--directory", str(workdir), *args]  # fmt: skip
    environment = dict(env or os.environ)
    environment["PATH"] = f"{BIN}{os.pathsep}{environment['PATH']}"
    environment.pop("MEMKIND_HBW_NODES", None)
    return subprocess.Popen(wrap(command), stderr=subprocess.STDOUT, text=True, env=environment,
                            cwd=REPO, **popen)  # fmt: skip


def snakemake(workdir: Path, *args: str, timeout: float = 600, **options
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """The workflow in ``workdir`` run to its end; its output in stdout."""
    with snakemake_process(workdir, *args, stdout=subprocess.PIPE, **options) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, output)


def make_wheelhouse(folder: Path) -> Path:
    """``folder`` holding the wheels the suite's image installs, as the workflow's build job
    downloads them (the same files every session, from pip's cache once downloaded)."""
    with open(folder / "download.log", "w") as log:
        download_wheels(folder, IMAGE_DEBIAN, source_dir=REPO, log=log)
    (folder / "download.log").unlink()
    return folder


def image_settings(wheelhouse: Path, **more) -> dict:
    """The ``container`` settings of the suite's image: Debian 13, pip from ``wheelhouse``
    alone, cached in IMAGE_CACHE."""
    return {"enabled": True, "image_dir": str(IMAGE_CACHE), "debian": IMAGE_DEBIAN,
            "wheelhouse": str(wheelhouse), **more}  # fmt: skip


@pytest.fixture(scope="session")
def apptainer() -> str:
    """The container runtime on PATH; skips the test without one."""
    runtime = find_runtime()
    if runtime is None:
        pytest.skip(RUNTIME_MISSING)
    return runtime


@dataclass(frozen=True)
class ImageBuild:
    """The CPU image being built (or found in IMAGE_CACHE) through the workflow."""

    process: subprocess.Popen
    workdir: Path
    wheelhouse: Path
    output: Path
    started: float


@pytest.fixture(scope="session", autouse=True)
def image_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Before the session's first test, when a test of the session needs the CPU image and a
    runtime is here: make the wheelhouse and start the workflow's build of the image (minutes
    when IMAGE_CACHE does not hold it), so it builds while other tests run."""
    needed = any("cpu_image" in item.fixturenames for item in request.session.items)
    if not needed or find_runtime() is None:
        yield None
        return
    wheelhouse = make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))
    work = workdir_with(tmp_path_factory.mktemp("image-build"),
                        container=image_settings(wheelhouse))  # fmt: skip
    output = work / "snakemake.out"
    with open(output, "w") as sink:
        process = snakemake_process(work, "results/e2e/build/images/hpcmem-cpu.json",
                                    stdout=sink)  # fmt: skip
    yield ImageBuild(process, work, wheelhouse, output, time.monotonic())
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=60)


@dataclass(frozen=True)
class BuiltImage:
    """The CPU image as the workflow built (or reused) it, with what the build printed."""

    ref: ImageRef
    output: str
    seconds: float
    workdir: Path
    wheelhouse: Path


@pytest.fixture(scope="session")
def cpu_image(apptainer: str, image_build: ImageBuild) -> BuiltImage:
    """The CPU image, once its build (started by ``image_build``) has finished."""
    returncode = image_build.process.wait(timeout=1800)
    output = image_build.output.read_text()
    assert returncode == 0, output
    ref = ImageRef.read(image_build.workdir / "results" / "e2e" / "build" / "images" /
                        "hpcmem-cpu.json")  # fmt: skip
    return BuiltImage(ref, output, time.monotonic() - image_build.started, image_build.workdir,
                      image_build.wheelhouse)
