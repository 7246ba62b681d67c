"""Apptainer images: definition files, cache keys, atomic cached builds, and what a run used.

An image is cached in ``IMAGE_DIR/NAME-KEY.sif`` where KEY digests what it is made of: the
definition, its build arguments, the content of every ``%files`` source (a wheel by its
members, so rebuilding an unchanged wheel keeps the key) and the host architecture. A build
writes a hidden partial file and renames it into place, then writes ``NAME-KEY.json`` next to
it; only an image with that file counts as built. Builds of one key are serialised by a lock.

Example::

    definition = parse_definition("containers/hpcmem-cpu.def")
    args = {"MIRROR": "http://deb.debian.org/debian", "WHEELHOUSE": "/tmp/wheels"}
    ref = obtain_image("hpcmem-cpu", definition, args, image_dir="results/images",
                       runtime="/usr/bin/apptainer", context=".", log=sys.stderr)
    ref.image, ref.digest, ref.built
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import stat
import subprocess
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hpcmem.errors import HpcmemError
from hpcmem.record.jsonl import atomic_open

__all__ = [
    "ContainerError",
    "Definition",
    "ImageRef",
    "cache_key",
    "checked_image",
    "host_arch",
    "image_arch",
    "image_digest",
    "obtain_image",
    "parse_definition",
]

#: Apptainer's bootstrap agents
AGENTS = frozenset({
    "library", "docker", "docker-daemon", "docker-archive", "oci", "oci-archive", "shub",
    "oras", "localimage", "debootstrap", "yum", "dnf", "zypper", "arch", "busybox", "scratch",
})  # fmt: skip
#: Apptainer's definition sections (app sections take the app's name after them)
SECTIONS = frozenset({
    "arguments", "setup", "files", "environment", "post", "runscript", "startscript", "test",
    "labels", "help", "appinstall", "appenv", "apprun", "applabels", "appfiles", "apphelp",
    "apptest", "appstart",
})  # fmt: skip
#: Apptainer's architecture names of Python's platform.machine()
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "i686": "386", "i386": "386",
           "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}  # fmt: skip
_VARIABLE = re.compile(r"\{\{\s*(\w+)\s*\}\}")
#: how the image's file system is packed: lz4 packs a 370 MB tree in about 2 s where gzip takes
#: 30 s (the image is 35 % larger); Linux >= 3.19 and squashfuse read it
SQUASHFS_OPTIONS = "-comp lz4"
_DIGEST_CHUNK = 1 << 20
#: what every SIF file holds after its 32-byte launch line: the start of the SIF global
#: header (github.com/apptainer/sif, pkg/sif: hdrMagic), so no runtime is needed to tell one
SIF_MAGIC = b"SIF_MAGIC\0"
SIF_MAGIC_OFFSET = 32


class ContainerError(HpcmemError, ValueError):
    """A container setting or image that cannot be honoured; the message says what to change."""


@dataclass(frozen=True)
class Definition:
    """A parsed definition file: its text, the sections it has, its ``{{ variables }}``."""

    path: Path
    text: str
    sections: tuple[str, ...]
    arguments: Mapping[str, str]
    variables: frozenset[str]

    def check_arguments(self, given: Mapping[str, str], workflow: Sequence[str] = ()) -> None:
        """Every ``{{ VAR }}`` has a value: a default in ``%arguments``, ``given``, or one of
        ``workflow`` (the names the workflow passes at build time)."""
        known = {*self.arguments, *given, *workflow}
        missing = sorted(self.variables - known)
        if missing:
            raise ContainerError(
                f"{self.path}: {{{{ {missing[0]} }}}} has no value: give it a default in "
                "%arguments"
            )

    def uses(self, name: str) -> bool:
        """Whether ``{{ name }}`` appears in the definition or ``%arguments`` declares it."""
        return name in self.arguments or name in self.variables

    def build_args(self, values: Mapping[str, str]) -> dict[str, str]:
        """The ``--build-arg`` values this definition uses, out of ``values``."""
        return {name: value for name, value in values.items() if self.uses(name)}

    def files_sources(self, values: Mapping[str, str]) -> list[str]:
        """The sources of the ``%files`` lines, with ``{{ VAR }}`` filled from ``values``."""
        sources = []
        for line in _section_lines(self.text, "files"):
            filled = _VARIABLE.sub(lambda m: values.get(m[1], self.arguments.get(m[1], "")), line)
            sources.append(filled.split()[0])
        return sources


def _section_name(line: str) -> str:
    """``post`` of ``%post`` (and of ``%files from stage``)."""
    return (line[1:].split() or [""])[0]


def _section_lines(text: str, name: str) -> Iterator[str]:
    """The non-blank, non-comment lines of every ``%name`` section."""
    inside = False
    for line in text.splitlines():
        if line.startswith("%"):
            inside = _section_name(line) == name
        elif inside and line.strip() and not line.lstrip().startswith("#"):
            yield line.strip()


def _check_header(header: dict[str, str], where: str) -> None:
    """A stage's header has a ``Bootstrap`` line."""
    if "bootstrap" not in header:
        raise ContainerError(f"{where}: no 'Bootstrap: AGENT' header before it")


def parse_definition(path: str | os.PathLike[str]) -> Definition:
    """Parse a definition file as Apptainer does, far enough to refuse what it would refuse:
    no ``Bootstrap`` header, an unknown agent, an unknown section. Errors name ``FILE:LINE``."""
    source = Path(path)
    try:
        if not stat.S_ISREG(source.stat().st_mode):  # a device or a pipe: read for ever
            raise ContainerError(f"{source}: not a regular file (a definition is text)")
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ContainerError(f"{source}: cannot read the definition ({error})") from None
    sections: list[str] = []
    arguments: dict[str, str] = {}
    header: dict[str, str] | None = {}  # the header being read; None inside the sections
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        content = line.strip()
        if not content or content.startswith("#"):
            continue
        where = f"{source}:{number}"
        if line.startswith("%"):
            if header is not None:
                _check_header(header, where)
            header, current = None, _section_name(line)
            if current not in SECTIONS:
                known = ", ".join(f"%{name}" for name in sorted(SECTIONS))
                raise ContainerError(f"{where}: unknown section %{current} (one of {known})")
            sections.append(current)
            continue
        if header is None and re.match(r"bootstrap\s*:", line, re.IGNORECASE):
            header = {}  # the next stage of a multi-stage definition
        if header is not None:
            key, colon, value = content.partition(":")
            if not colon or not re.fullmatch(r"[A-Za-z]\w*", key.strip()):
                raise ContainerError(f"{where}: {content!r} is not a 'KEY: VALUE' header line")
            header[key.strip().lower()] = value.strip()
            if key.strip().lower() == "bootstrap" and value.strip().lower() not in AGENTS:
                known = ", ".join(sorted(AGENTS))
                raise ContainerError(f"{where}: Bootstrap {value.strip()!r} is not an agent "
                                     f"({known})")
        elif current == "arguments":
            name, _, value = content.partition("=")
            arguments[name.strip()] = value.strip()
    if header is not None:
        _check_header(header, str(source))
    variables = frozenset(_VARIABLE.findall(text))
    return Definition(source, text, tuple(sections), arguments, variables)


def host_arch() -> str:
    """This host's architecture as Apptainer names it (amd64, arm64, ...)."""
    machine = platform.machine()
    return _ARCHES.get(machine, machine)


def sif_problem(image: str | os.PathLike[str]) -> str | None:
    """Why the file ``image`` is not a SIF image (its header, read without a runtime), or
    None when it is one."""
    try:
        with open(image, "rb") as handle:
            handle.seek(SIF_MAGIC_OFFSET)
            found = handle.read(len(SIF_MAGIC))
    except OSError as error:
        return f"cannot read it: {error.strerror or error}"
    if found != SIF_MAGIC:
        return (f"its bytes {SIF_MAGIC_OFFSET} to {SIF_MAGIC_OFFSET + len(SIF_MAGIC) - 1} are "
                f"{found!r}, where every SIF file holds {SIF_MAGIC!r}")
    return None


def image_arch(runtime: str, image: str | os.PathLike[str]) -> str:
    """The architecture of a SIF image's root file system (``apptainer sif list``)."""
    try:
        out = subprocess.run([runtime, "sif", "list", str(image)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ContainerError(f"{image}: cannot read the image ({error})") from None
    found = re.search(r"FS \(\w+/\*?\w+/(\w+)\)", out.stdout)
    if out.returncode != 0 or not found:
        reason = (out.stderr.strip().splitlines() or ["no root file system"])[-1]
        raise ContainerError(f"{image}: not a SIF image ({reason})")
    return found[1]


def image_digest(image: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of the image file."""
    digest = hashlib.sha256()
    with open(image, "rb") as handle:
        while chunk := handle.read(_DIGEST_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _update_with(digest: Any, path: Path, name: str) -> None:
    """Feed ``path`` into ``digest``: a wheel by its members (its zip timestamps change with
    every build), a folder by its files (no __pycache__), any other file by its bytes."""
    if path.is_dir():
        for child in sorted(path.iterdir()):
            if child.name != "__pycache__":
                _update_with(digest, child, f"{name}/{child.name}")
        return
    digest.update(f"{name}\0".encode())
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            for member in sorted(wheel.namelist()):
                digest.update(member.encode() + hashlib.sha256(wheel.read(member)).digest())
    else:
        digest.update(hashlib.sha256(path.read_bytes()).digest())


def cache_key(definition: Definition, args: Mapping[str, str],
              context: str | os.PathLike[str]) -> str:  # fmt: skip
    """What an image is made of, digested: definition, build args, the content of the
    ``%files`` sources (relative to ``context``; not where they are), the host architecture
    and how the file system is packed."""
    files = {name for line in _section_lines(definition.text, "files")
             for name in _VARIABLE.findall(line)}  # fmt: skip
    values = {k: v for k, v in definition.build_args(args).items() if k not in files}
    digest = hashlib.sha256(definition.text.encode())
    digest.update(json.dumps(sorted(values.items())).encode())
    digest.update(f"{host_arch()}\0{SQUASHFS_OPTIONS}".encode())
    for number, source in enumerate(definition.files_sources(args)):
        path = Path(context, source)
        if not path.exists():
            raise ContainerError(f"{definition.path}: %files source {source} does not exist")
        _update_with(digest, path, str(number))  # by position: a source may be a temporary copy
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ImageRef:
    """What a run uses for one image: the image and its digest, or why it runs natively."""

    name: str
    gpu: bool
    image: str | None
    digest: str | None = None
    runtime: str | None = None
    runtime_version: str | None = None
    arch: str | None = None
    key: str | None = None
    built: bool = False
    build_seconds: float | None = None
    log: str | None = None
    reason: str | None = None
    definition: str | None = None

    def environment(self) -> dict[str, str]:
        """The variables a job in this image gets (recorded by every record it writes)."""
        return {
            "HPCMEM_CONTAINER_IMAGE": str(self.image),
            "HPCMEM_CONTAINER_DIGEST": str(self.digest),
            "HPCMEM_CONTAINER_RUNTIME": os.path.basename(str(self.runtime)),
            "HPCMEM_CONTAINER_RUNTIME_VERSION": str(self.runtime_version),
        }

    def to_json(self) -> str:
        """The reference as JSON text."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ImageRef:
        """A reference written by :meth:`to_json`."""
        with open(path) as handle:
            return cls(**json.load(handle))


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _run_logged(command: list[str], log: TextIO, cwd: str | os.PathLike[str]) -> int:
    log.write("+ " + " ".join(command) + "\n")
    log.flush()
    return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd).returncode


def _last_error(log_path: str | None) -> str:
    """The last FATAL/ERROR line of a build log, for a one-line message."""
    if not log_path or not os.path.exists(log_path):
        return ""
    lines = Path(log_path).read_text(errors="replace").splitlines()
    errors = [line.strip() for line in lines if re.match(r"\s*(FATAL|ERROR|E:)", line)]
    return (errors or [line.strip() for line in lines if line.strip()] or [""])[-1]


def build_image(definition: Definition, args: Mapping[str, str], image: Path, *, runtime: str,
                context: str | os.PathLike[str], log: TextIO, log_path: str | None = None
                ) -> None:  # fmt: skip
    """Build ``image`` from ``definition``; it appears only once complete (a hidden partial
    file renamed into place). A failure raises naming the definition and the build log."""
    partial = image.with_name(f".{image.name}.{os.getpid()}.partial")
    command = [runtime, "build", "--force", "--fakeroot", "--mksquashfs-args", SQUASHFS_OPTIONS]
    for name, value in sorted(definition.build_args(args).items()):
        command += ["--build-arg", f"{name}={value}"]
    command += [str(partial), str(definition.path.resolve())]
    try:
        status = _run_logged(command, log, context)
    except OSError as error:
        status, log_message = -1, str(error)
    else:
        log_message = ""
    if status != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        log.flush()
        why = log_message or _last_error(log_path) or f"exit status {status}"
        where = f"; build log: {log_path}" if log_path else ""
        raise ContainerError(f"building {image.name} from {definition.path} failed: {why}{where}")
    os.replace(partial, image)


def _smoke_test(runtime: str, image: Path, log: TextIO) -> None:
    """Run ``hpcmem --version`` in the image: it starts on this host and has hpcmem."""
    status = _run_logged([runtime, "exec", str(image), "hpcmem", "--version"], log, ".")
    if status != 0:
        raise ContainerError(f"{image} does not run here: `{runtime} exec {image} hpcmem "
                             f"--version` exited {status}")  # fmt: skip


def checked_image(ref: ImageRef, log: TextIO) -> ImageRef:
    """``ref`` with its image's architecture and digest, once the image is known to be made
    for this host and to start here."""
    image, runtime = Path(str(ref.image)), str(ref.runtime)
    arch = image_arch(runtime, image)
    if arch != host_arch():
        raise ContainerError(f"{image} is built for {arch}, this host runs {host_arch()}")
    _smoke_test(runtime, image, log)
    return dataclasses.replace(ref, arch=arch, digest=image_digest(image))


def obtain_image(name: str, definition: Definition, args: Mapping[str, str], *,
                 image_dir: str | os.PathLike[str], runtime: str, runtime_version: str,
                 context: str | os.PathLike[str], log: TextIO, log_path: str | None = None,
                 gpu: bool = False) -> ImageRef:  # fmt: skip
    """The cached image of ``definition`` with ``args``, built when missing, then checked
    (:func:`checked_image`). Raises :class:`ContainerError` naming the build log."""
    folder = Path(image_dir).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    key = cache_key(definition, args, context)
    image, stamp = folder / f"{name}-{key}.sif", folder / f"{name}-{key}.json"
    started = time.monotonic()
    ref = ImageRef(name=name, gpu=gpu, image=str(image), runtime=runtime,
                   runtime_version=runtime_version, key=key, log=log_path,
                   definition=str(definition.path))  # fmt: skip
    with _locked(folder / f".{name}-{key}.lock"):
        if not (image.is_file() and stamp.is_file()):
            for stale in folder.glob(f".{image.name}.*.partial"):
                stale.unlink()
            stamp.unlink(missing_ok=True)
            build_image(definition, args, image, runtime=runtime, context=context, log=log,
                        log_path=log_path)  # fmt: skip
            seconds = round(time.monotonic() - started, 1)
            ref = checked_image(dataclasses.replace(ref, built=True, build_seconds=seconds), log)
            with atomic_open(stamp) as handle:
                handle.write(ref.to_json())
            return ref
    return checked_image(ref, log)
