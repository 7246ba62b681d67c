# Config loading and validation, wildcard constraints, and the small get_ helpers. What they
# compute lives in hpcmem/workflow/: config, run_lock, points (one job per point; a point's
# folder, options and key come from its benchmark's spec), commands, containers, outcome. A
# refusal before any job is one line and exit 2 (refusal.py).

import contextlib
import datetime
import functools
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from hpcmem.collectives.spec import COLLECTIVES
from hpcmem.errors import HpcmemError
from hpcmem.record.provenance import git_sha
from hpcmem.train.spec import TRAIN
from hpcmem.workflow import commands
from hpcmem.workflow.config import check_config, validate_config
from hpcmem.workflow.containers import benchmark_image, container_binds, resolve_container
from hpcmem.workflow.points import collectives_points, point_layout, train_layout, train_points
from hpcmem.workflow.refusal import refuse_bad_input
from hpcmem.workflow.run_lock import hold_run_folder


@contextlib.contextmanager
def stop_on_error(prefix=""):
    """An hpcmem error raised inside stops the workflow with its one line (after ``prefix``)."""
    try:
        yield
    except HpcmemError as error:
        raise WorkflowError(f"{prefix}{error}") from None


with refuse_bad_input():
    validate_config(config, os.path.join(workflow.basedir, "schemas", "config.schema.yaml"))
    check_config(config)
if config["run_id"] is None:
    config["run_id"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
#: the folder of every point of the sweep, one job each, by benchmark
FOLDERS = {spec.name: [spec.folder(point) for point in points(config)]
           for spec, points in ((COLLECTIVES, collectives_points), (TRAIN, train_points))}
#: every output of this run lives under RUN
RUN = os.path.join(config["output_dir"], config["run_id"])
#: this run's lock on RUN, held until snakemake exits (None: this invocation runs no job)
with refuse_bad_input():  # one run per run folder at a time, before anything is built
    RUN_LOCK = hold_run_folder(workflow, RUN)
#: the repository holding pyproject.toml and native/ (what build_wheel builds)
SOURCE_DIR = os.path.dirname(workflow.basedir)
#: the interpreter running snakemake; the per-run environment is layered over it
PYTHON = sys.executable
#: the commit being built and run (HPCMEM_GIT_SHA where the source is not a git checkout):
#: the installed wheel lies outside the checkout, so the jobs are told which commit they run
GIT_SHA = git_sha(SOURCE_DIR) or ""
if not GIT_SHA:
    logger.warning(
        f"hpcmem: {SOURCE_DIR} is not a git checkout and HPCMEM_GIT_SHA is not set: "
        "the records of this run will name no commit"
    )
#: where the benchmark jobs run: in images (run_collectives and run_train call `apptainer
#: exec` themselves, one container per rank) or natively; resolved before any job is
#: submitted. Do not add `--sdm apptainer`: it would wrap the jobs' own `apptainer exec`.
with refuse_bad_input("config "):
    CONTAINERS = resolve_container(config, source_dir=SOURCE_DIR,
                                   binds=container_binds(os.getcwd(), config["output_dir"]))
logger.info(f"hpcmem: {CONTAINERS.reason}")


wildcard_constraints:
    image=f"{CONTAINERS.cpu.name}|{CONTAINERS.gpu.name}",  # the rules constrain their point


def get_layout(wildcards, spec=COLLECTIVES):
    """Where the point's ranks run: its folder's layout, or GPU count in the train sweep's."""
    with stop_on_error():
        point = spec.parse_folder(wildcards.point)
        return (point_layout(point) if spec is COLLECTIVES
                else train_layout(config, point["world_size"]))


def get_hpcmem(wildcards, input):
    """The ``hpcmem`` executable of this run's environment (installed from the built wheel)."""
    return os.path.join(input.venv, "bin", "hpcmem")


def get_command(spec, command):
    """A params function: ``command``'s words (hpcmem/workflow/commands.py) for the job's
    point of benchmark ``spec``, in the image ``input.image`` names, else natively."""

    def words(wildcards, input, output):
        point = spec.parse_folder(wildcards.point)
        partial = functools.partial(command, config, point, output.records)
        return CONTAINERS.job_command(partial, input.get("image"), get_hpcmem(wildcards, input))

    return words


def benchmark_inputs(gpu):
    """Input function of a benchmark rule: the run's environment and its image's reference."""
    return lambda wildcards: {"venv": rules.install_wheel.output.venv} | (
        {"image": rules.build_container.output.ref.format(image=image.name)}
        if (image := benchmark_image(CONTAINERS, gpu, config["train"], workflow, logger)) else {})


def compare_native():
    """Whether the collectives points also run natively (images in use, and asked for)."""
    return CONTAINERS.enabled and CONTAINERS.compare_native and config["collectives"]["enabled"]


def get_all_records(wildcards):
    """Every record file of the sweep (collectives and training points)."""
    return (expand(rules.run_collectives.output.records, point=FOLDERS["collectives"])
            + expand(rules.run_train.output.records, point=FOLDERS["train"]))


def get_native_records(wildcards):
    """The record files of the native comparison points ([] without a comparison)."""
    native = rules.run_collectives_native.output.records
    return expand(native, point=FOLDERS["collectives"]) if compare_native() else []
