"""Apptainer images: cache keys, atomic cached builds, and what a run used.

An image is cached in ``IMAGE_DIR/NAME-KEY.sif`` where KEY digests what it is made of: the
definition, its build arguments, the content of every ``%files`` source (the source tree) and
of every folder bound into the build (a wheelhouse; a wheel by its members, so a rebuilt
unchanged wheel keeps the key), and the host architecture. A build writes a hidden partial
file and renames it into place, then writes ``NAME-KEY.json`` next to it; only an image with
that file counts as built, and ``NAME-KEY.log`` keeps its build log. Builds of one key are
serialised by a lock. Before a run uses an image it is checked: made for this host, and it
starts and imports hpcmem here (:data:`PROBE`, whose answer, the image's own library versions,
the reference keeps). A file given as a prebuilt image is told from one by its SIF header
(:func:`sif_problem`), which needs no runtime.

The runtime itself is driven by :mod:`~hpcmem.workflow.containers.apptainer`; definitions are
parsed by :mod:`~hpcmem.workflow.containers.definitions`.

Example::

    definition = parse_definition("containers/hpcmem-cpu.def")
    args = {"MIRROR": "http://deb.debian.org/debian", "DEBIAN": "trixie"}
    ref = obtain_image("hpcmem-cpu", definition, args, image_dir="results/images",
                       runtime="/usr/bin/apptainer", runtime_version="1.4.5", context=".",
                       log=sys.stderr)
    ref.image, ref.digest, ref.built, ref.libraries["mpi"]
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hpcmem.record.jsonl import atomic_open
from hpcmem.workflow.containers import apptainer
from hpcmem.workflow.containers.apptainer import SQUASHFS_OPTIONS, ContainerError, image_arch
from hpcmem.workflow.containers.definitions import Definition
from hpcmem.workflow.containers.registry import unreachable_base

__all__ = ["ImageRef", "cache_key", "checked_image", "host_arch", "image_digest", "obtain_image",
           "sif_problem"]

#: Apptainer's architecture names of Python's platform.machine()
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "i686": "386", "i386": "386",
           "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}  # fmt: skip
_DIGEST_CHUNK = 1 << 20
#: what every SIF file holds after its 32-byte launch line: the start of the SIF global
#: header (github.com/apptainer/sif, pkg/sif: hdrMagic), so no runtime is needed to tell one
SIF_MAGIC = b"SIF_MAGIC\0"
SIF_MAGIC_OFFSET = 32


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


def cache_key(definition: Definition, args: Mapping[str, str], context: str | os.PathLike[str],
              binds: Sequence[str] = ()) -> str:  # fmt: skip
    """What an image is made of, digested: definition, build args, the content of the
    ``%files`` sources (relative to ``context``; not where they are) and of the folders bound
    into the build (``SRC:DEST[:ro]``: a wheelhouse), the host architecture and how the file
    system is packed."""
    files = definition.files_variables()
    values = {k: v for k, v in definition.build_args(args).items() if k not in files}
    digest = hashlib.sha256(definition.text.encode())
    digest.update(json.dumps(sorted(values.items())).encode())
    digest.update(f"{host_arch()}\0{SQUASHFS_OPTIONS}".encode())
    sources = [(f"%files source {source}", Path(context, source), str(number))
               for number, source in enumerate(definition.files_sources(args))]  # fmt: skip
    for bind in binds:
        source, _, dest = bind.partition(":")
        sources.append((f"bound folder {source}", Path(source), dest))
    for what, path, name in sources:
        if not path.exists():
            raise ContainerError(f"{definition.path}: {what} does not exist")
        _update_with(digest, path, name)  # by position or mount point: sources may be copies
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
    labels: Mapping[str, str] | None = None
    libraries: Mapping[str, str] | None = None

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


#: run in an image before it is used: it starts here, imports hpcmem's native modules, and says
#: what it carries (records made in the image name the same versions)
PROBE = """
import json, platform, mpi4py, numpy, hpcmem, hpcmem._timing
from hpcmem.hbw import backend
from hpcmem.node.probe import mpi_library
release = dict(word.split("=", 1) for word in open("/etc/os-release").read().split() if "=" in word)
hbw = backend()
print(json.dumps({
    "os": release.get("VERSION_CODENAME"), "python": platform.python_version(),
    "hpcmem": hpcmem.__version__, "numpy": numpy.__version__, "mpi4py": mpi4py.__version__,
    "mpi": mpi_library(), "hbw_backend": f"{hbw.name} {hbw.version}",
}))
"""


def _last_error(log_path: str | None) -> str:
    """The last FATAL/ERROR line of a build log, for a one-line message."""
    if not log_path or not os.path.exists(log_path):
        return ""
    lines = Path(log_path).read_text(errors="replace").splitlines()
    errors = [line.strip() for line in lines if re.match(r"\s*(FATAL|ERROR|E:)", line)]
    return (errors or [line.strip() for line in lines if line.strip()] or [""])[-1]


def build_image(definition: Definition, args: Mapping[str, str], image: Path, *, runtime: str,
                context: str | os.PathLike[str], log: TextIO, log_path: str | None = None,
                binds: Sequence[str] = ()) -> None:  # fmt: skip
    """Build ``image`` from ``definition``; it appears only once complete (a hidden partial
    file renamed into place). A failure raises naming the definition and the build log."""
    partial = image.with_name(f".{image.name}.{os.getpid()}.partial")
    try:
        apptainer.build(runtime, definition.path, partial, build_args=definition.build_args(args),
                        binds=binds, context=context, log=log, shown=image.name)  # fmt: skip
    except ContainerError as error:
        partial.unlink(missing_ok=True)
        log.flush()
        why = _last_error(log_path) or str(error)
        where = f"; build log: {log_path}" if log_path else ""
        raise ContainerError(
            f"building {image.name} from {definition.path} failed: {why}{where}") from None
    os.replace(partial, image)


def checked_image(ref: ImageRef, log: TextIO) -> ImageRef:
    """``ref`` with its image's architecture, digest, labels and libraries, once the image is
    known to be made for this host and to start here."""
    image, runtime = Path(str(ref.image)), str(ref.runtime)
    arch = image_arch(runtime, image)
    if arch != host_arch():
        raise ContainerError(f"{image} is built for {arch}, this host runs {host_arch()}")
    log.write(f"+ {runtime} exec {image} python -I -c PROBE\n")
    try:  # -I: the image's own hpcmem, not a source tree in the working directory (bound in)
        libraries = json.loads(apptainer.execute(runtime, image, ["python", "-I", "-c", PROBE]))
    except ContainerError as error:
        raise ContainerError(f"{image} does not run here: {error}") from None
    except ValueError as error:
        raise ContainerError(f"{image} does not run here: its probe printed no JSON ({error})"
                             ) from None
    return dataclasses.replace(ref, arch=arch, digest=image_digest(image),
                               labels=apptainer.labels(runtime, image),
                               libraries=libraries)  # fmt: skip


def obtain_image(name: str, definition: Definition, args: Mapping[str, str], *,
                 image_dir: str | os.PathLike[str], runtime: str, runtime_version: str,
                 context: str | os.PathLike[str], log: TextIO, log_path: str | None = None,
                 gpu: bool = False, binds: Sequence[str] = ()) -> ImageRef:  # fmt: skip
    """The cached image of ``definition`` with ``args`` (and ``binds`` while it builds), built
    when missing, then checked (:func:`checked_image`). Raises :class:`ContainerError` naming
    the build log, or, before building, the registry of a base image that does not answer
    here (:func:`~hpcmem.workflow.containers.registry.unreachable_base`)."""
    folder = Path(image_dir).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    key = cache_key(definition, args, context, binds)
    image, stamp = folder / f"{name}-{key}.sif", folder / f"{name}-{key}.json"
    started = time.monotonic()
    ref = ImageRef(name=name, gpu=gpu, image=str(image), runtime=runtime,
                   runtime_version=runtime_version, key=key, log=log_path,
                   definition=str(definition.path))  # fmt: skip
    with _locked(folder / f".{name}-{key}.lock"):
        if not (image.is_file() and stamp.is_file()):
            if why := unreachable_base(definition, args):
                raise ContainerError(f"{name} is not built: {why}")
            for stale in folder.glob(f".{image.name}.*.partial"):
                stale.unlink()
            stamp.unlink(missing_ok=True)
            build_image(definition, args, image, runtime=runtime, context=context, log=log,
                        log_path=log_path, binds=binds)  # fmt: skip
            seconds = round(time.monotonic() - started, 1)
            ref = checked_image(dataclasses.replace(ref, built=True, build_seconds=seconds), log)
            if log_path:  # how the image was made stays with it
                log.flush()
                shutil.copyfile(log_path, stamp.with_suffix(".log"))
            with atomic_open(stamp) as handle:
                handle.write(ref.to_json())
            return ref
    return checked_image(ref, log)
