"""Apptainer/Singularity images for the workflow: whether to use one, building, digests, exec.

``container.enabled`` in the workflow config is ``auto`` (use a runtime when ``apptainer``
or ``singularity`` is on PATH, else run natively), ``true`` (require one: without it
:func:`resolve_container` raises before any job is submitted) or ``false`` (always native).
Natively run jobs record ``container: null``; jobs run in an image export
``HPCMEM_CONTAINER_IMAGE`` and ``HPCMEM_CONTAINER_DIGEST`` into it, which
:func:`hpcmem.results.records.common_fields` records.

Example (``workflow/rules/common.smk``)::

    from hpcmem.workflow.containers import ContainerError, resolve_container
    try:
        CONTAINERS = resolve_container(config)
    except ContainerError as error:
        raise WorkflowError(str(error))
    # CONTAINERS.enabled, CONTAINERS.reason, CONTAINERS.exec_command(...)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RUNTIMES",
    "ContainerError",
    "ContainerPlan",
    "build_image",
    "find_runtime",
    "image_digest",
    "resolve_container",
]

#: container runtimes, in order of preference (Apptainer also installs `singularity`)
RUNTIMES = ("apptainer", "singularity")
_INSTALL_HINT = "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)"
_DIGEST_CHUNK = 1 << 20


class ContainerError(ValueError):
    """A container setting that cannot be honoured; the message says what to change."""


def find_runtime(path: str | None = None) -> str | None:
    """The first of :data:`RUNTIMES` found on ``path`` (default: ``$PATH``), as a full path."""
    for name in RUNTIMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def image_digest(image: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of the image file."""
    digest = hashlib.sha256()
    with open(image, "rb") as handle:
        while chunk := handle.read(_DIGEST_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


@dataclass(frozen=True)
class ContainerPlan:
    """Where the workflow's jobs run: in images through ``runtime``, or natively."""

    enabled: bool
    runtime: str | None
    reason: str
    cpu_definition: Path
    gpu_definition: Path
    image_dir: Path
    binds: tuple[str, ...] = field(default=())

    @property
    def cpu_image(self) -> Path:
        """The image built from ``cpu_definition`` (collectives, aggregation, reports)."""
        return self.image_dir / "hpcmem-cpu.sif"

    @property
    def gpu_image(self) -> Path:
        """The image built from ``gpu_definition`` (training)."""
        return self.image_dir / "hpcmem.sif"

    def exec_command(
        self,
        command: Sequence[str],
        *,
        gpu: bool = False,
        launcher: Sequence[str] = (),
        digest: str | None = None,
    ) -> list[str]:
        """The command line running ``command``: ``LAUNCHER apptainer exec [--nv] ... IMAGE CMD``.

        ``launcher`` is the MPI launcher and its options (``["srun", "-n", "2"]``); it runs
        on the host and starts one container per rank (the hybrid model). ``digest`` is
        the image's (default: computed from the file). Natively: ``LAUNCHER CMD``.
        """
        if not self.enabled:
            return [*launcher, *command]
        image = self.gpu_image if gpu else self.cpu_image
        digest = digest or image_digest(image)
        words = [*launcher, str(self.runtime), "exec"]
        if gpu:
            words.append("--nv")
        for bind in self.binds:
            words += ["--bind", bind]
        words += ["--env", f"HPCMEM_CONTAINER_IMAGE={image},HPCMEM_CONTAINER_DIGEST={digest}"]
        return [*words, str(image), *command]

    def record(self, gpu: bool = False) -> dict[str, str] | None:
        """The ``container`` field of a result record: image and digest, or None natively."""
        if not self.enabled:
            return None
        image = self.gpu_image if gpu else self.cpu_image
        return {"image": str(image), "digest": image_digest(image)}


def _enabled(value: Any) -> bool | str:
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[value.lower()]
    if isinstance(value, bool):
        return value
    raise ContainerError(f"container.enabled: {value!r} is not one of auto, true, false")


def resolve_container(
    config: Mapping[str, Any], *, path: str | None = None, binds: Sequence[str] = ()
) -> ContainerPlan:
    """Resolve ``config["container"]`` (the workflow config) against this host's runtimes.

    ``auto`` runs in images when a runtime is on PATH and natively otherwise; ``true``
    without a runtime raises :class:`ContainerError` (call this at parse time, before any
    job is submitted); ``false`` always runs natively. ``binds`` are host paths mounted
    into every container (the working directory, shared file systems).
    """
    settings = config.get("container") or {}
    enabled = _enabled(settings.get("enabled", "auto"))
    runtime = find_runtime(path) if enabled else None
    if enabled is True and runtime is None:
        raise ContainerError(
            "container.enabled is true but neither apptainer nor singularity is on PATH: "
            f"{_INSTALL_HINT}, or set container.enabled to auto (run natively without one)"
        )
    if runtime:
        reason = f"container.enabled={enabled}: running in images through {runtime}"
    elif enabled == "auto":
        reason = "container.enabled=auto: no apptainer or singularity on PATH, running natively"
    else:
        reason = "container.enabled=false: running natively"
    return ContainerPlan(
        enabled=runtime is not None,
        runtime=runtime,
        reason=reason,
        cpu_definition=Path(settings.get("cpu_definition", "containers/hpcmem-cpu.def")),
        gpu_definition=Path(settings.get("gpu_definition", "containers/hpcmem.def")),
        image_dir=Path(settings.get("image_dir", "results/images")),
        binds=tuple(binds),
    )


def build_image(
    definition: str | os.PathLike[str],
    image: str | os.PathLike[str],
    *,
    runtime: str,
    context: str | os.PathLike[str] = ".",
) -> str:
    """Build ``image`` from ``definition`` with ``runtime``; returns the image's digest.

    The definition's ``%files`` paths are relative to ``context`` (the repository root).
    Through spython (singularity-python) when the runtime is ``singularity``, which is
    the binary spython calls; through the runtime's own CLI otherwise. Unprivileged
    users build with ``--fakeroot``. The image appears only once it is complete.
    """
    target = Path(image).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    options = [] if os.geteuid() == 0 else ["--fakeroot"]
    recipe = str(Path(definition).resolve())
    try:
        if Path(runtime).name == "singularity":
            _spython_build(recipe, partial, options, context)
        else:
            command = [runtime, "build", "--force", *options, str(partial), recipe]
            subprocess.run(command, check=True, cwd=context)
    except (OSError, subprocess.CalledProcessError) as error:
        partial.unlink(missing_ok=True)
        raise ContainerError(f"building {target} from {definition} failed: {error}") from None
    if not partial.is_file():
        raise ContainerError(f"building {target} from {definition} produced no image")
    os.replace(partial, target)
    return image_digest(target)


def _spython_build(recipe: str, image: Path, options: list[str], context: str | os.PathLike[str]):
    """``singularity build`` through spython, from ``context`` (spython takes no cwd)."""
    from spython.main import Client

    cwd = os.getcwd()
    os.chdir(context)
    try:
        Client.build(recipe=recipe, image=str(image), sudo=False, force=True, options=options,
                     build_folder=str(image.parent))  # fmt: skip
    finally:
        os.chdir(cwd)
