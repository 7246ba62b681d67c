"""Apptainer/Singularity for the workflow: where its jobs run, and the images they run in.

- :mod:`.plan`: config ``container`` resolved against this host (:func:`resolve_container`),
  and a job's command line in an image or natively (:class:`ContainerPlan`).
- :mod:`.images`: an image built once per cache key, checked before a run uses it
  (:func:`obtain_image`), and what a run used (:class:`ImageRef`).
- :mod:`.definitions`: definition files parsed as Apptainer parses them.
- :mod:`.wheelhouse`: where an image's pip gets its packages.
- :mod:`.apptainer`: every operation of the runtime itself (spython's client underneath);
  every failure is one :class:`ContainerError` line.

Example (``workflow/rules/common.smk``, ``workflow/scripts/build_container.py``)::

    from hpcmem.workflow.containers import container_binds, obtain_image, resolve_container

    plan = resolve_container(config, binds=container_binds(os.getcwd(), "results"))
    spec = plan.image("hpcmem-cpu")
    ref = obtain_image(spec.name, parse_definition(spec.definition), spec.build_args,
                       image_dir=plan.image_dir, runtime=plan.runtime, context=".",
                       runtime_version=runtime_version(plan.runtime), log=sys.stderr)
"""

from hpcmem.workflow.containers.apptainer import (
    ContainerError,
    build,
    exec_command,
    execute,
    image_arch,
    labels,
    runtime_version,
)
from hpcmem.workflow.containers.definitions import Definition, parse_definition
from hpcmem.workflow.containers.images import (
    ImageRef,
    cache_key,
    checked_image,
    host_arch,
    image_digest,
    obtain_image,
    sif_problem,
)
from hpcmem.workflow.containers.plan import (
    DEFAULT_DEBIAN,
    DEFAULT_GPU_BASE,
    DEFAULT_MIRROR,
    RUNTIMES,
    ContainerPlan,
    ImageSpec,
    benchmark_image,
    container_binds,
    find_runtime,
    gpu_image_unneeded,
    resolve_container,
)
from hpcmem.workflow.containers.wheelhouse import (
    RELEASES,
    WHEELHOUSE_MOUNT,
    PipSource,
    check_pip_source,
    download_wheels,
    pip_source,
)

__all__ = [
    "DEFAULT_DEBIAN",
    "DEFAULT_GPU_BASE",
    "DEFAULT_MIRROR",
    "RELEASES",
    "RUNTIMES",
    "WHEELHOUSE_MOUNT",
    "ContainerError",
    "ContainerPlan",
    "Definition",
    "ImageRef",
    "ImageSpec",
    "PipSource",
    "benchmark_image",
    "build",
    "cache_key",
    "check_pip_source",
    "checked_image",
    "container_binds",
    "download_wheels",
    "exec_command",
    "execute",
    "find_runtime",
    "gpu_image_unneeded",
    "host_arch",
    "image_arch",
    "image_digest",
    "labels",
    "obtain_image",
    "parse_definition",
    "pip_source",
    "resolve_container",
    "runtime_version",
    "sif_problem",
]
