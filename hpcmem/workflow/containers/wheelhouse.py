"""Where the images' pip gets its packages (config ``container.pip_index``, ``wheelhouse``).

- ``wheelhouse: FOLDER``: bound at :data:`WHEELHOUSE_MOUNT`; the image's pip reads it alone
  (``--no-index --find-links``).
- ``pip_index: URL``: the image's pip reads that index (``PIP_INDEX``); a ``file:///FOLDER``
  index is bound at :data:`INDEX_MOUNT`.
- neither: for the CPU image, :func:`download_wheels` makes the wheelhouse first with this
  host's pip (``pip download`` for the image's Python and C library of what its build stage
  installs, ``containers/cpu-packages.txt`` at ``requirements.txt``'s pins), so this host's
  index, proxy and certificates apply and the image's pip reads nothing else; the GPU
  image's pip reads its definition's default index.

Example::

    pip_source({"wheelhouse": "/w"}, "trixie").binds     # ('/w:/opt/hpcmem/wheelhouse:ro',)
    download_wheels(Path("/tmp/wheels"), "trixie", source_dir=Path("."), log=sys.stderr)
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hpcmem.workflow.containers.apptainer import ContainerError

__all__ = ["INDEX_MOUNT", "RELEASES", "WHEELHOUSE_MOUNT", "PipSource", "check_pip_source",
           "download_wheels", "pip_source"]

#: where a wheelhouse is bound while an image builds: its pip installs from it alone
WHEELHOUSE_MOUNT = "/opt/hpcmem/wheelhouse"
#: where a local index folder (``pip_index: file:///FOLDER``) is bound while an image builds
INDEX_MOUNT = "/opt/hpcmem/index"
#: the Python version and glibc minor version of each Debian release the CPU image is built on
RELEASES = {"bookworm": ("3.11", 36), "trixie": ("3.13", 41)}
#: the oldest manylinux a wheel may declare (manylinux1 is glibc 2.5)
_OLDEST_GLIBC = 5


@dataclass(frozen=True)
class PipSource:
    """How an image's pip gets its packages: build arguments, folders bound into the build,
    and the Debian release whose wheels this host's pip downloads first (or None)."""

    build_args: Mapping[str, str] = field(default_factory=dict)
    binds: tuple[str, ...] = ()
    download: str | None = None


def pip_source(settings: Mapping[str, Any], release: str | None) -> PipSource:
    """The pip source of ``settings`` (config ``container``) for an image of Debian
    ``release`` (None: not a Debian image, the GPU one)."""
    index = settings.get("pip_index") or ""
    if settings.get("wheelhouse"):
        return PipSource(binds=(f"{os.path.abspath(settings['wheelhouse'])}:"
                                f"{WHEELHOUSE_MOUNT}:ro",))  # fmt: skip
    if index.startswith("file://"):
        return PipSource(build_args={"PIP_INDEX": f"file://{INDEX_MOUNT}"},
                         binds=(f"{index.removeprefix('file://')}:{INDEX_MOUNT}:ro",))
    if index:
        return PipSource(build_args={"PIP_INDEX": index})
    return PipSource(download=release)


def check_pip_source(settings: Mapping[str, Any]) -> None:
    """A wheelhouse is a folder holding wheels; a local index is a folder."""
    if folder := settings.get("wheelhouse"):
        if not os.path.isdir(folder):
            raise ContainerError(f"container.wheelhouse: {folder}: no such folder")
        if not any(name.endswith(".whl") for name in os.listdir(folder)):
            raise ContainerError(f"container.wheelhouse: {folder} holds no wheel (*.whl): "
                                 "pip download or pip wheel the images' packages into it")
    index = settings.get("pip_index") or ""
    if index.startswith("file://") and not os.path.isdir(index.removeprefix("file://")):
        raise ContainerError(f"container.pip_index: {index}: no such folder")


def download_wheels(folder: Path, release: str, *, source_dir: Path, log: TextIO) -> None:
    """``folder`` gets the wheels the CPU image of Debian ``release`` installs."""
    python, glibc = RELEASES[release]
    platforms = []
    for minor in range(_OLDEST_GLIBC, glibc + 1):
        platforms += ["--platform", f"manylinux_2_{minor}_{platform.machine()}"]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder),
               "--only-binary", ":all:", "--python-version", python, *platforms,
               "-c", str(source_dir / "requirements.txt"),
               "-r", str(source_dir / "containers" / "cpu-packages.txt")]  # fmt: skip
    log.write(f"+ {shlex.join(command)}\n")
    log.flush()
    if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
        raise ContainerError(f"pip download of the {release} image's packages failed "
                             "(see the build log)")  # fmt: skip
