"""Every Apptainer/Singularity operation of the workflow, in one place.

Building an image, inspecting it (its labels), running a command in it and asking the
runtime's version go through spython's client (``spython.main.Client``, singularity-python).
spython runs the command ``singularity``, which Apptainer installs beside ``apptainer`` as an
alias: each call puts the runtime's folder first on PATH, so spython runs the runtime the
workflow chose. What a build prints goes to its log; every failure, the runtime's or spython's
own, is one :class:`ContainerError` line (the workflow prints it; ``build_container.py
--required`` exits 1 with it, a failed step in the README's table).

Two things spython lacks are assembled here, and nowhere else:

- :func:`exec_command`: ``LAUNCHER apptainer exec ... IMAGE COMMAND``, the hybrid MPI form in
  which the host's launcher (``srun``, ``mpirun``) starts one container per rank. spython's
  ``execute`` runs one container itself; nothing can stand in front of it.
- :func:`image_arch`: the architecture of a SIF's root file system (``apptainer sif list``):
  spython has no ``sif`` command, and the labels ``inspect`` reads need not be there.

Example::

    runtime_version("/usr/bin/apptainer")                       # '1.4.5'
    build("/usr/bin/apptainer", Path("containers/hpcmem-cpu.def"), Path("cpu.sif"),
          build_args={"DEBIAN": "trixie"}, binds=(), context=".", log=sys.stderr)
    labels("/usr/bin/apptainer", "cpu.sif")["org.label-schema.build-arch"]   # 'amd64'
    execute("/usr/bin/apptainer", "cpu.sif", ["hpcmem", "--version"])
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from spython.main import Client

from hpcmem.errors import HpcmemError, clip
from hpcmem.workflow.containers.progress import run_logged

__all__ = ["SQUASHFS_OPTIONS", "ContainerError", "build", "exec_command", "execute",
           "image_arch", "labels", "runtime_version"]

#: how the image's file system is packed: lz4 packs a 370 MB tree in about 2 s where gzip takes
#: 30 s (the image is 35 % larger); Linux >= 3.19 and squashfuse read it
SQUASHFS_OPTIONS = "-comp lz4"
#: seconds a short operation (version, inspect, exec, sif list) may take
SHORT_TIMEOUT = 300


class ContainerError(HpcmemError, ValueError):
    """A container setting or image that cannot be honoured; the message says what to change."""


def _last_line(text: str | None) -> str:
    """The last FATAL/ERROR line of a runtime's output, else its last line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"(FATAL|ERROR|E:)", line)]
    return (errors or lines or [""])[-1]


def _run(command: Sequence[str], *, log: TextIO | None = None,
         cwd: str | os.PathLike[str] | None = None,
         what: str = "") -> subprocess.CompletedProcess:  # fmt: skip
    """``command`` run to its end: its output into ``log`` (with the command line first), its
    stages said on stderr as ``what`` (:mod:`.progress`), or captured when there is no log;
    raises :class:`ContainerError` when it cannot start."""
    try:
        if log is None:
            return subprocess.run(list(command), capture_output=True, text=True, cwd=cwd,
                                  timeout=SHORT_TIMEOUT)  # fmt: skip
        log.write(f"+ {shlex.join(command)}\n")
        log.flush()
        return subprocess.CompletedProcess(command, run_logged(command, log, what, cwd=cwd))
    except (OSError, subprocess.SubprocessError) as error:
        raise ContainerError(f"{shlex.join(command[:2])}: {error}") from None


class _Client(type(Client)):
    """spython's client whose commands run through :func:`_run`, keeping the last result."""

    def __init__(self, log: TextIO | None = None,
                 cwd: str | os.PathLike[str] | None = None, what: str = "") -> None:  # fmt: skip
        super().__init__()
        self.log, self.cwd, self.what = log, cwd, what
        self.quiet = False  # no --quiet: a build log keeps the runtime's INFO lines
        self.result: subprocess.CompletedProcess | None = None

    def _run_command(self, cmd: list[str], **_: Any) -> dict[str, Any]:
        self.result = _run(cmd, log=self.log, cwd=self.cwd, what=self.what)
        return {"message": self.result.stdout, "return_code": self.result.returncode}


@contextmanager
def _as_singularity(runtime: str) -> Iterator[None]:
    """While inside, spython's ``singularity`` is ``runtime`` (its folder first on PATH)."""
    found = shutil.which(runtime)
    if found is None:
        raise ContainerError(f"{runtime}: no such runtime")
    folder = os.path.dirname(os.path.abspath(found))
    if shutil.which("singularity", path=folder) is None:
        raise ContainerError(f"{found}: no `singularity` beside it, the command spython runs "
                             "(Apptainer installs it as an alias of apptainer)")  # fmt: skip
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = folder + os.pathsep + saved
    try:
        yield
    finally:
        os.environ["PATH"] = saved


def _call(runtime: str, what: str, operation: Callable[[], Any]) -> Any:
    """``operation()`` (a spython call) with ``runtime`` as spython's ``singularity``; what
    spython raises or exits with becomes one line naming ``what``."""
    with _as_singularity(runtime):
        try:
            return operation()
        except ContainerError:
            raise
        except SystemExit as stop:  # spython's bot.exit on a refused argument
            raise ContainerError(f"{what}: spython stopped (exit status {stop.code})") from None
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as error:
            raise ContainerError(f"{what}: {type(error).__name__}: {error}") from None


def runtime_version(runtime: str) -> str:
    """The runtime's version (``1.4.5`` of ``apptainer version 1.4.5``)."""
    text = _call(runtime, f"{runtime} --version", Client.version)
    words = text.split() if isinstance(text, str) else []
    if not words:
        raise ContainerError(f"{runtime} --version failed: {text}")
    return words[-1]


def build(runtime: str, definition: Path, image: Path, *, build_args: Mapping[str, str],
          binds: Sequence[str], context: str | os.PathLike[str], log: TextIO,
          shown: str | None = None) -> None:
    """Build ``image`` from ``definition`` (its ``%files`` relative to ``context``), with
    ``--fakeroot``; ``binds`` are mounted while ``%post`` runs; its stages said on stderr as
    the build of ``shown`` (the image's file name; None: ``image``'s). Raises on failure."""
    options = ["--force", "--fakeroot", "--mksquashfs-args", SQUASHFS_OPTIONS]
    for name, value in sorted(build_args.items()):
        options += ["--build-arg", f"{name}={value}"]
    for bind in binds:
        options += ["--bind", bind]
    client = _Client(log, cwd=context, what=f"building {shown or image.name}")
    _call(runtime, f"building {image.name}",
          lambda: client.build(recipe=str(definition.resolve()), image=str(image), sudo=False,
                               options=options, quiet=True))  # fmt: skip
    status = client.result.returncode if client.result else -1
    if status != 0 or not image.is_file():
        raise ContainerError(f"exit status {status}")


def labels(runtime: str, image: str | os.PathLike[str]) -> dict[str, str]:
    """The image's labels (its own and those the build adds: build arch, date, runtime)."""
    found = _call(runtime, f"inspecting {image}",
                  lambda: Client.inspect(str(image), quiet=True))  # fmt: skip
    if "attributes" not in found:
        output = found.get("message") or []
        text = "\n".join(output) if isinstance(output, list) else str(output)
        raise ContainerError(f"{runtime} inspect {image} failed: {_last_line(text)}")
    return dict(found["attributes"].get("labels") or {})


def execute(runtime: str, image: str | os.PathLike[str], command: Sequence[str], *,
            binds: Sequence[str] = ()) -> str:  # fmt: skip
    """What ``command`` prints when run in ``image``; raises when it exits non-zero."""
    client = _Client()
    _call(runtime, f"running {command[0]} in {image}",
          lambda: client.execute(str(image), list(command), bind=list(binds) or None,
                                 quiet=True))  # fmt: skip
    if client.result is None or client.result.returncode != 0:
        status = client.result.returncode if client.result else -1
        why = _last_line(client.result.stderr if client.result else "")
        words = clip(shlex.join(command).replace("\n", " "), 120)
        raise ContainerError(f"`{runtime} exec {image} {words}` exited {status}"
                             + (f": {why}" if why else ""))  # fmt: skip
    return client.result.stdout


def image_arch(runtime: str, image: str | os.PathLike[str]) -> str:
    """The architecture of a SIF image's root file system (``apptainer sif list``)."""
    out = _run([runtime, "sif", "list", str(image)])
    found = re.search(r"FS \(\w+/\*?\w+/(\w+)\)", out.stdout)
    if out.returncode != 0 or not found:
        raise ContainerError(f"{image}: not a SIF image "
                             f"({_last_line(out.stderr) or 'no root file system'})")  # fmt: skip
    return found[1]


def exec_command(runtime: str, image: str, command: Sequence[str], *,
                 binds: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 nv: bool = False, launcher: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """``LAUNCHER RUNTIME exec [--nv] --bind B... --env K=V... IMAGE COMMAND``: with a launcher
    on the host, one container per rank (the hybrid model)."""
    words = [*launcher, runtime, "exec", *(["--nv"] if nv else [])]
    for bind in binds:
        words += ["--bind", bind]
    for name, value in (env or {}).items():
        words += ["--env", f"{name}={value}"]
    return [*words, image, *command]
