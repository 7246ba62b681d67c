"""Pytest plugin: the container runtime, and the CPU image built once per session.

``apptainer`` is the runtime on PATH; without one, the tests that need it are skipped saying
how to get one (``make test`` as root runs the installer named by APPTAINER_INSTALLER).
``cpu_image`` builds the CPU image through the workflow's own build_container rule into a
session folder (images are keyed there by definition and wheel), so every later workflow run
of the session that names that folder reuses it. ``without_runtime`` runs a command on a
host that has no runtime: in a mount namespace where every runtime on PATH is masked.
"""

from __future__ import annotations

import os
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
RUNTIME_MISSING = (
    "needs Apptainer on PATH: `make test` as root installs it when APPTAINER_INSTALLER "
    "names an installer; elsewhere install Apptainer >= 1.2"
)

__all__ = ["BuiltImage", "snakemake", "without_runtime", "workdir_with"]


def without_runtime(command: Sequence[str]) -> list[str]:
    """``command`` run where ``apptainer`` and ``singularity`` cannot be found: each one on
    PATH is covered by /dev/null (not executable) in a private mount namespace."""
    found = {os.path.realpath(p) for p in (shutil.which(n) for n in RUNTIMES) if p}
    masks = "".join(f"mount --bind /dev/null '{path}' && " for path in sorted(found))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'{masks}exec "$@"', "sh", *command]  # fmt: skip


def workdir_with(folder: Path, **sections: dict) -> Path:
    """``folder`` with a copy of the tests' tiny config, its sections updated."""
    shutil.copytree(REPO / ".test" / "config", folder / "config")
    path = folder / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config))
    return folder


def snakemake(workdir: Path, *args: str, profile: Path = REPO / "profiles" / "local",
              wrap=list, env: dict[str, str] | None = None, timeout: float = 600
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """The workflow in ``workdir`` (``wrap`` wraps the command line); output in stdout."""
    snakefile = REPO / "workflow" / "Snakefile"
    command = [str(BIN / "snakemake"), "--profile", str(profile), "--snakefile", str(snakefile),
               "--directory", str(workdir), *args]  # fmt: skip
    environment = dict(env or os.environ)
    environment["PATH"] = f"{BIN}{os.pathsep}{environment['PATH']}"
    environment.pop("MEMKIND_HBW_NODES", None)
    return subprocess.run(wrap(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=environment, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="session")
def apptainer() -> str:
    """The container runtime on PATH; skips the test without one."""
    runtime = find_runtime()
    if runtime is None:
        pytest.skip(RUNTIME_MISSING)
    return runtime


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's image folder (container.image_dir of the workflow runs that share it)."""
    return tmp_path_factory.mktemp("images")


@dataclass(frozen=True)
class BuiltImage:
    """The CPU image as the workflow built it, with what the build printed."""

    ref: ImageRef
    output: str
    seconds: float
    workdir: Path


@pytest.fixture(scope="session")
def cpu_image(apptainer: str, image_cache: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> BuiltImage:  # fmt: skip
    """Build the CPU image through the workflow (target: this run's image reference)."""
    work = workdir_with(tmp_path_factory.mktemp("image-build"),
                        container={"enabled": True, "image_dir": str(image_cache)})  # fmt: skip
    started = time.monotonic()
    result = snakemake(work, "results/e2e/build/images/hpcmem-cpu.json")
    assert result.returncode == 0, result.stdout
    ref = ImageRef.read(work / "results" / "e2e" / "build" / "images" / "hpcmem-cpu.json")
    return BuiltImage(ref, result.stdout, time.monotonic() - started, work)
