"""Where the workflow's jobs run (config ``container``): in images or natively, and how.

``container.enabled`` in the workflow config:

- ``false``: every job runs natively; records say ``container: null``.
- ``true``: a runtime is required. Without ``apptainer`` or ``singularity`` on PATH
  :func:`resolve_container` raises before any job is submitted; an image that cannot be
  built or run stops the run, naming the build log.
- ``auto`` (the default): without a runtime, natively (one line says so). With one, the
  workflow builds (or reuses) the images; a benchmark whose image cannot be built or run
  on this host runs natively instead, and one line says why. So ``auto`` never turns a
  run that works natively into a failing one.

A definition that does not parse, or a prebuilt image that is missing, not a SIF file (its
header is read without a runtime) or made for another architecture, is bad input in both
``auto`` and ``true``: it stops the run before any job.

Jobs in an image get ``HPCMEM_CONTAINER_*`` variables, which
:func:`hpcmem.node.probe.current_container` records (image, digest, runtime and its
version).

Example (``workflow/rules/common.smk``)::

    plan = resolve_container(config, source_dir=SOURCE_DIR,
                             binds=container_binds(os.getcwd(), config["output_dir"]))
    plan.cpu.definition, plan.reason, plan.build_options("hpcmem-cpu", SOURCE_DIR)
    plan.job_command(lambda hpcmem: [hpcmem, "info"], "results/r/build/images/hpcmem-cpu.json",
                     "results/r/build/venv/bin/hpcmem")
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.workflow.containers.apptainer import ContainerError, exec_command, image_arch
from hpcmem.workflow.containers.definitions import parse_definition
from hpcmem.workflow.containers.images import ImageRef, host_arch, sif_problem
from hpcmem.workflow.containers.wheelhouse import check_pip_source, pip_source

__all__ = ["DEFAULT_DEBIAN", "DEFAULT_GPU_BASE", "DEFAULT_MIRROR", "RUNTIMES", "ContainerPlan",
           "ImageSpec", "benchmark_image", "container_binds", "find_runtime",
           "gpu_image_unneeded", "resolve_container"]

#: why the GPU image is not built, as said once by this process
_SAID: set[str] = set()

#: container runtimes, in order of preference (Apptainer also installs `singularity`)
RUNTIMES = ("apptainer", "singularity")
#: the Debian mirror the CPU image bootstraps from (config container.mirror)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: the Debian release of the CPU image (config container.debian)
DEFAULT_DEBIAN = "bookworm"
#: the base image of the GPU image (config container.gpu_base)
DEFAULT_GPU_BASE = "nvidia/cuda:12.6.3-devel-ubuntu24.04"
_INSTALL_HINT = "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)"


def container_binds(workdir: str, output_dir: str) -> list[str]:
    """Host folders mounted into every container: the working directory, and the output
    folder when it lies elsewhere (records are written there from inside the image)."""
    output = os.path.abspath(output_dir)
    return [workdir] if output.startswith(workdir + os.sep) else [workdir, output]


def gpu_image_unneeded(train: Mapping[str, Any], executor: str | None,
                       driver: Path = Path("/proc/driver/nvidia")) -> str | None:
    """Why no training point needs the GPU image, or None: the sweep trains nothing or on
    the CPU (``train``: the config's section), or its points run on this machine
    (``executor``: not a Slurm one) and ``driver`` says no NVIDIA driver is loaded here, so
    they record ``skipped`` without ever running in it. A Slurm job's GPU is another node's,
    so there the image is always built."""
    if not train.get("models") or not train.get("enabled", True):
        return "no training points in the sweep"
    if train.get("device") == "cpu":
        return "train.device is cpu"
    if not str(executor or "").startswith("slurm") and not driver.exists():
        return (f"no NVIDIA driver on this machine ({driver} is missing): its training points "
                "record skipped")
    return None


def benchmark_image(plan: ContainerPlan, gpu: bool, train: Mapping[str, Any], workflow: Any,
                    logger: Any) -> ImageSpec | None:
    """The image a benchmark (on a GPU or not) of ``workflow`` runs in under ``plan``: none of
    the GPU image where no training point can run in it (:func:`gpu_image_unneeded`, the
    run's executor known once its jobs are made), which ``logger`` says once."""
    image = plan.benchmark_image(gpu)
    if image is None or not gpu:
        return image
    why = gpu_image_unneeded(train, getattr(workflow.executor_plugin, "name", None))
    if why is not None and why not in _SAID:
        _SAID.add(why)
        logger.info(f"hpcmem: the GPU image is not built: {why}")
    return image if why is None else None


def find_runtime(path: str | None = None) -> str | None:
    """The first of :data:`RUNTIMES` found on ``path`` (default: ``$PATH``), as a full path."""
    for name in RUNTIMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


@dataclass(frozen=True)
class ImageSpec:
    """One image the workflow may run in: built from ``definition`` (``build_binds`` mounted
    while it builds; with ``download_wheels``, a wheelhouse this host's pip makes for that
    Debian release), or ``prebuilt``."""

    name: str
    definition: Path
    build_args: Mapping[str, str]
    prebuilt: Path | None
    gpu: bool
    build_binds: tuple[str, ...] = ()
    download_wheels: str | None = None


@dataclass(frozen=True)
class ContainerPlan:
    """Where the workflow's benchmark jobs run: in images through ``runtime``, or natively."""

    enabled: bool
    required: bool
    runtime: str | None
    reason: str
    image_dir: Path
    cpu: ImageSpec
    gpu: ImageSpec
    compare_native: bool = False
    binds: tuple[str, ...] = field(default=())

    @property
    def cpu_image(self) -> Path:
        """What the rules' ``container:`` directives name for CPU steps: the definition (the
        built image's name carries a key known only once the run's wheel exists)."""
        return self.cpu.prebuilt or self.cpu.definition

    @property
    def gpu_image(self) -> Path:
        """The ``container:`` label of GPU steps (see :attr:`cpu_image`)."""
        return self.gpu.prebuilt or self.gpu.definition

    def image(self, name: str) -> ImageSpec:
        """The CPU or GPU image called ``name``."""
        return self.gpu if name == self.gpu.name else self.cpu

    def benchmark_image(self, gpu: bool) -> ImageSpec | None:
        """The image a benchmark (on a GPU or not) runs in; None when it runs natively."""
        return (self.gpu if gpu else self.cpu) if self.enabled else None

    def build_options(self, name: str, source_dir: str) -> list[str]:
        """Options of ``workflow/scripts/build_container.py`` for image ``name``."""
        spec = self.image(name)
        options = ["--name", spec.name, "--definition", str(spec.definition), "--image-dir",
                   str(self.image_dir), "--runtime", str(self.runtime), "--context",
                   source_dir]  # fmt: skip
        for arg, value in spec.build_args.items():
            options += ["--build-arg", f"{arg}={value}"]
        for bind in spec.build_binds:
            options += ["--bind", bind]
        if spec.download_wheels:
            options += ["--download-wheels", spec.download_wheels]
        if spec.prebuilt:
            options += ["--prebuilt", str(spec.prebuilt)]
        return options + (["--gpu"] if spec.gpu else []) + (["--required"] if self.required
                                                             else [])

    def job_command(self, words: Callable[[str], list[str]], image_ref: str | None,
                    hpcmem: str) -> list[str]:
        """``words(HPCMEM)`` as a benchmark job runs it: through :meth:`exec_command` with the
        image's own ``hpcmem`` when the run uses images and ``image_ref`` (the run's
        :class:`ImageRef` file) names one, else natively with ``hpcmem``."""
        image = ImageRef.read(image_ref) if self.enabled and image_ref else None
        if image is None or image.image is None:
            return words(hpcmem)
        return self.exec_command(words("hpcmem"), image)

    def exec_command(
        self, command: Sequence[str], image: ImageRef, *, launcher: Sequence[str] = ()
    ) -> list[str]:
        """``LAUNCHER apptainer exec [--nv] --bind ... --env ... IMAGE COMMAND``, or natively
        ``LAUNCHER COMMAND`` when ``image`` says the benchmark runs without one.

        ``launcher`` is the MPI launcher and its options (``["srun", "-n", "2"]``); it runs
        on the host and starts one container per rank (the hybrid model).
        """
        if image.image is None:
            return [*launcher, *command]
        return exec_command(image.runtime or str(self.runtime), image.image, command,
                            binds=self.binds, env=image.environment(), nv=image.gpu,
                            launcher=launcher)  # fmt: skip


def _enabled(value: Any) -> bool | str:
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[value.lower()]
    if isinstance(value, bool):
        return value
    raise ContainerError(f"container.enabled: {value!r} is not one of auto, true, false")


def _spec(settings: Mapping[str, Any], kind: str, source_dir: Path) -> ImageSpec:
    gpu = kind == "gpu"
    default = "containers/hpcmem.def" if gpu else "containers/hpcmem-cpu.def"
    definition = source_dir / settings.get(f"{kind}_definition", default)
    release = None if gpu else settings.get("debian", DEFAULT_DEBIAN)
    pip = pip_source(settings, release)
    if gpu:
        build_args = {**pip.build_args, "BASE": settings.get("gpu_base", DEFAULT_GPU_BASE)}
    else:
        build_args = {**pip.build_args, "MIRROR": settings.get("mirror", DEFAULT_MIRROR),
                      "DEBIAN": str(release)}  # fmt: skip
    prebuilt = settings.get(f"{kind}_image")
    return ImageSpec(
        name="hpcmem" if gpu else "hpcmem-cpu",
        definition=definition,
        build_args=build_args,
        prebuilt=Path(prebuilt).absolute() if prebuilt else None,
        gpu=gpu,
        build_binds=pip.binds,
        download_wheels=pip.download,
    )


def _check_prebuilt(spec: ImageSpec) -> None:
    """A prebuilt image must be a SIF file, with or without a runtime on this host."""
    if spec.prebuilt is None:
        return
    kind = "gpu" if spec.gpu else "cpu"
    if not spec.prebuilt.is_file():
        raise ContainerError(f"container.{kind}_image: {spec.prebuilt}: no such image file")
    problem = sif_problem(spec.prebuilt)
    if problem:
        raise ContainerError(
            f"container.{kind}_image: {spec.prebuilt} is not a SIF image ({problem}): give "
            f"one made by `apptainer build` or `singularity build`, or null to build one "
            f"from container.{kind}_definition")


def _check_spec(spec: ImageSpec, runtime: str) -> None:
    """Bad input stops here: a definition that does not parse, a prebuilt image made for
    another architecture."""
    kind = "gpu" if spec.gpu else "cpu"
    if spec.prebuilt is None:
        try:
            definition = parse_definition(spec.definition)
            definition.check_arguments(spec.build_args)
        except ContainerError as error:
            raise ContainerError(f"container.{kind}_definition: {error}") from None
        return
    try:
        arch = image_arch(runtime, spec.prebuilt)
    except ContainerError as error:
        raise ContainerError(f"container.{kind}_image: {error}") from None
    if arch != host_arch():
        raise ContainerError(
            f"container.{kind}_image: {spec.prebuilt} is built for {arch}, this host runs "
            f"{host_arch()}: use an image built on {host_arch()}, or null to build one here"
        )


def resolve_container(
    config: Mapping[str, Any],
    *,
    source_dir: str | os.PathLike[str] = ".",
    path: str | None = None,
    binds: Sequence[str] = (),
) -> ContainerPlan:
    """Resolve ``config["container"]`` (the workflow config) against this host's runtimes.

    Call it at parse time: ``true`` without a runtime, and bad input (see the module's
    docstring), raise :class:`ContainerError` before any job is submitted. Definitions are
    relative to ``source_dir`` (the repository); ``binds`` are host paths mounted into every
    container (the working directory, shared file systems).
    """
    settings = config.get("container") or {}
    mode = _enabled(settings.get("enabled", "auto"))
    cpu, gpu = (_spec(settings, kind, Path(source_dir)) for kind in ("cpu", "gpu"))
    if mode:
        _check_prebuilt(cpu)
        _check_prebuilt(gpu)
    runtime = find_runtime(path) if mode else None
    if mode is True and runtime is None:
        raise ContainerError(
            "container.enabled is true but neither apptainer nor singularity is on PATH: "
            f"{_INSTALL_HINT}, or set container.enabled to auto (run natively without one)"
        )
    if runtime is None:
        how = ("no apptainer or singularity on PATH, " if mode else "") + "running natively"
    else:
        check_pip_source(settings)
        _check_spec(cpu, runtime)
        _check_spec(gpu, runtime)
        how = f"running in images through {runtime}" + (
            "" if mode is True else
            "; a benchmark whose image cannot be built or run here runs natively"
        )  # fmt: skip
    return ContainerPlan(
        enabled=runtime is not None,
        required=mode is True,
        runtime=runtime,
        reason=f"container.enabled={str(mode).lower()}: {how}",
        image_dir=Path(settings.get("image_dir", "results/images")),
        cpu=cpu,
        gpu=gpu,
        compare_native=bool(settings.get("compare_native", True)),
        binds=tuple(binds),
    )
