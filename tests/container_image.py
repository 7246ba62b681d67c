"""Pytest plugin: the container runtime, and the CPU image built once per session.

``apptainer`` is the runtime on PATH; without one, the tests that need it are skipped saying
how to get one (``make test`` as root runs the installer HPCMEM_APPTAINER_INSTALLER names).
``cpu_image`` is the CPU image built through the workflow's own build_container rule into a
session folder (images are keyed there by definition and wheel), so every later workflow run
of the session that names that folder reuses it; the build starts before the first test and
runs alongside the others. ``without_runtime`` runs a command on a
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

from hpcmem.workflow.container_images import ImageRef
from hpcmem.workflow.containers import RUNTIMES, find_runtime

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: a Debian mirror that refuses connections at once: the CPU image cannot be built
NO_MIRROR = "http://127.0.0.1:9/debian"
RUNTIME_MISSING = (
    "needs Apptainer on PATH: `make test` as root installs it when HPCMEM_APPTAINER_INSTALLER "
    "names an installer; elsewhere install Apptainer >= 1.2"
)

__all__ = ["NO_MIRROR", "BuiltImage", "host_open_mpi", "leftovers", "snakemake",
           "snakemake_process", "without_runtime", "workdir_with"]


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


@pytest.fixture(scope="session")
def apptainer() -> str:
    """The container runtime on PATH; skips the test without one."""
    runtime = find_runtime()
    if runtime is None:
        pytest.skip(RUNTIME_MISSING)
    return runtime


@dataclass(frozen=True)
class ImageBuild:
    """The CPU image being built through the workflow, into the session's image folder."""

    process: subprocess.Popen
    workdir: Path
    image_dir: Path
    output: Path
    started: float


@pytest.fixture(scope="session", autouse=True)
def image_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Before the session's first test, when a test of the session needs the CPU image and a
    runtime is here: start building it (minutes), so it builds while other tests run."""
    needed = any("cpu_image" in item.fixturenames for item in request.session.items)
    if not needed or find_runtime() is None:
        yield None
        return
    image_dir = tmp_path_factory.mktemp("images")
    work = workdir_with(tmp_path_factory.mktemp("image-build"),
                        container={"enabled": True, "image_dir": str(image_dir)})  # fmt: skip
    output = work / "snakemake.out"
    with open(output, "w") as sink:
        process = snakemake_process(work, "results/e2e/build/images/hpcmem-cpu.json",
                                    stdout=sink)  # fmt: skip
    yield ImageBuild(process, work, image_dir, output, time.monotonic())
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=60)


@dataclass(frozen=True)
class BuiltImage:
    """The CPU image as the workflow built it, with what the build printed."""

    ref: ImageRef
    output: str
    seconds: float
    workdir: Path


@pytest.fixture(scope="session")
def cpu_image(apptainer: str, image_build: ImageBuild) -> BuiltImage:
    """The CPU image, once its build (started by ``image_build``) has finished."""
    returncode = image_build.process.wait(timeout=1200)
    output = image_build.output.read_text()
    assert returncode == 0, output
    ref = ImageRef.read(image_build.workdir / "results" / "e2e" / "build" / "images" /
                        "hpcmem-cpu.json")  # fmt: skip
    return BuiltImage(ref, output, time.monotonic() - image_build.started, image_build.workdir)
