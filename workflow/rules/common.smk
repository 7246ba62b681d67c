# Config loading and validation, wildcard constraints, and the small get_ helpers.

import datetime
import glob
import itertools
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from hpcmem.node.planned import BINDINGS
from hpcmem.node.state import YIELD_ENV
from hpcmem.record.provenance import git_sha
from hpcmem.results.verdict_file import read_verdict
from hpcmem.results.verdict_summary import summary_lines
from hpcmem.um import PRESETS
from hpcmem.units import parse_size as size_bytes
from hpcmem.workflow.container_images import ImageRef
from hpcmem.workflow.containers import ContainerError, resolve_container
from hpcmem.workflow.layout import FOLDER_PATTERN, Layout, LayoutError, sweep_layouts


validate(config, schema="../schemas/config.schema.yaml")


def parse_size(value, key):
    """Bytes of a message size (8, '4K', '1M'), parsed as `hpcmem collectives` parses it;
    not a power of two stops naming ``key``."""
    size = size_bytes(str(value))
    if size & (size - 1):
        raise WorkflowError(f"config {key}: {value!r} is not a power of two (8, 4K, 1M, ...)")
    return size


def check_printable(value, key="config"):
    """Stop naming the key when a string holds a control character (the schema's patterns
    end in ``$``, which Python's re also matches before a final newline)."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_printable(name, key)
            check_printable(item, f"{key}.{name}" if key != "config" else name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_printable(item, f"{key}[{index}]")
    elif isinstance(value, str) and not value.isprintable():
        raise WorkflowError(f"config {key}: {value!r} contains a control character")


def check_names(key, names, builtin, defined, defined_key):
    """Stop with a one-line error naming ``key`` when a name is neither built in nor defined."""
    accepted = (*builtin, *defined)
    for name in names:
        if name not in accepted:
            raise WorkflowError(
                f"config {key}: {name!r} is not one of {', '.join(accepted)} "
                f"(define new ones under {defined_key})"
            )


def check_not_builtin(key, defined, builtin):
    """Stop naming ``key`` when a name defined there would shadow a built-in one."""
    for name in defined:
        if name in builtin:
            raise WorkflowError(
                f"config {key}: {name!r} is a built-in name (built in: {', '.join(builtin)}); "
                "give yours another name"
            )


def check_folder(key, path):
    """Stop naming ``key`` when ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise WorkflowError(f"config {key}: {path!r} is a file, not a folder")


check_printable(config)
check_folder("output_dir", config["output_dir"])
check_folder("check.history", config["check"]["history"])
if not (config["collectives"]["enabled"] or config["train"]["enabled"]):
    raise WorkflowError("config collectives.enabled, train.enabled: both false, nothing to run")
if config["run_id"] is None:
    config["run_id"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
if parse_size(config["collectives"]["min_size"], "collectives.min_size") > parse_size(
    config["collectives"]["max_size"], "collectives.max_size"
):
    raise WorkflowError("config collectives.min_size: larger than collectives.max_size")
check_not_builtin(
    "collectives.custom_bindings", config["collectives"]["custom_bindings"], BINDINGS
)
check_not_builtin("train.policy_files", config["train"]["policy_files"], tuple(PRESETS))
check_names(
    "collectives.bindings",
    config["collectives"]["bindings"],
    BINDINGS,
    config["collectives"]["custom_bindings"],
    "collectives.custom_bindings",
)
try:
    LAYOUTS = sweep_layouts(config["collectives"])
except LayoutError as error:
    raise WorkflowError(str(error))
check_names(
    "train.policies",
    config["train"]["policies"],
    tuple(PRESETS),
    config["train"]["policy_files"],
    "train.policy_files",
)

#: every output of this run lives under RUN
RUN = os.path.join(config["output_dir"], config["run_id"])
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


def container_binds():
    """Host folders mounted into every container: the working directory, and the output
    folder when it lies elsewhere (records are written there from inside the image)."""
    here, output = os.getcwd(), os.path.abspath(config["output_dir"])
    return [here] if output.startswith(here + os.sep) else [here, output]


#: where the benchmark jobs run: in images through Apptainer/Singularity (run_collectives and
#: run_train call `apptainer exec` themselves, one container per rank) or natively; resolved
#: here so that container.enabled: true without a runtime, a definition that does not parse
#: or a prebuilt image for another architecture stop before any job is submitted. Do not add
#: `--sdm apptainer`: it would wrap the benchmark jobs' own `apptainer exec` in a container.
try:
    CONTAINERS = resolve_container(config, source_dir=SOURCE_DIR, binds=container_binds())
except ContainerError as error:
    raise WorkflowError(f"config {error}")
logger.info(f"hpcmem: {CONTAINERS.reason}")


wildcard_constraints:
    op="[a-z_]+",
    buffer="[a-z_]+",
    layout=FOLDER_PATTERN,
    binding="[a-z][a-z0-9_]*",
    model="[a-z][a-z0-9_]*",
    params="default|[0-9.]+[KMB]?",
    policy="[a-z][a-z0-9_]*",
    budget="none|[0-9]+[KMGT]?",
    image=f"{CONTAINERS.cpu.name}|{CONTAINERS.gpu.name}",


def collectives_points():
    """One dict of wildcards per collectives point (op x buffer x layout x binding)."""
    sweep = config["collectives"]
    if not sweep["enabled"]:
        return []
    axes = (sweep["ops"], sweep["buffers"], LAYOUTS, sweep["bindings"])
    return [
        dict(op=op, buffer=buffer, layout=layout.folder, binding=binding)
        for op, buffer, layout, binding in itertools.product(*axes)
    ]


def get_layout(wildcards):
    """The point's nodes and tasks per node, from its folder (``ranks2``, ``nodes2_ranks4``)."""
    return Layout.from_folder(wildcards.layout)


def get_launch_options(wildcards, resources):
    """Options of the launcher (``resources.mpi``) that start the point's ranks on its nodes."""
    return get_layout(wildcards).launch_options(str(resources.mpi))


def train_points():
    """One dict of wildcards per training point (model x params x policy x budget)."""
    sweep = config["train"]
    if not sweep["enabled"]:
        return []
    axes = (sweep["models"], sweep["params"], sweep["policies"], sweep["gpu_budgets"])
    return [
        dict(model=model, params=params, policy=policy, budget=budget)
        for model, params, policy, budget in itertools.product(*axes)
    ]


def get_run_env(wildcards):
    """VAR=value words for ``env``: run id, commit, MEMKIND_HBW_NODES when HBW is emulated,
    and Open MPI's yield-when-idle when collectives.yield_when_idle asks for it."""
    words = [f"HPCMEM_RUN_ID={config['run_id']}"]
    if GIT_SHA:
        words.append(f"HPCMEM_GIT_SHA={GIT_SHA}")
    if config["collectives"]["emulate_hbw"] is not None:
        words.append(f"MEMKIND_HBW_NODES={config['collectives']['emulate_hbw']}")
    if config["collectives"]["yield_when_idle"]:
        words.append(f"{YIELD_ENV}=1")
    return words


def get_binding(wildcards):
    """The binding handed to ``hpcmem bind``: a built-in name or explicit numactl arguments."""
    custom = config["collectives"]["custom_bindings"]
    return custom.get(wildcards.binding, wildcards.binding)


def get_collectives_options(wildcards):
    """Sweep options of ``hpcmem collectives`` shared by every point."""
    sweep = config["collectives"]
    options = ["--min-size", str(sweep["min_size"]), "--max-size", str(sweep["max_size"])]
    for key in ("iterations", "warmup"):
        if sweep[key] is not None:
            options += [f"--{key}", str(sweep[key])]
    return options + ["--repeats", str(sweep["repeats"])]


def get_policy(wildcards):
    """The ``--policy`` value: a preset name or the path of a policy file."""
    return config["train"]["policy_files"].get(wildcards.policy, wildcards.policy)


def get_train_options(wildcards):
    """Options of ``hpcmem train`` for one point besides model and policy."""
    sweep = config["train"]
    options = ["--steps", str(sweep["steps"]), "--warmup", str(sweep["warmup"])]
    if wildcards.params != "default":
        options += ["--params", wildcards.params]
    if wildcards.budget != "none":
        options += ["--gpu-budget", wildcards.budget]
    return options


def get_hpcmem(wildcards, input):
    """The ``hpcmem`` executable of this run's environment (installed from the built wheel)."""
    return os.path.join(input.venv, "bin", "hpcmem")


def collectives_words(wildcards, output):
    """``hpcmem bind --skip-unavailable -- BINDING -- hpcmem collectives ...`` as a function of
    the ``hpcmem`` to run (a binding this node lacks gives skipped records)."""
    return lambda hpcmem: [
        hpcmem, "bind", "--skip-unavailable", "--", get_binding(wildcards), "--",
        hpcmem, "collectives", "--op", wildcards.op, "--buffer", wildcards.buffer,
        *get_collectives_options(wildcards), "--output", output.records,
    ]  # fmt: skip


def get_collectives_command(wildcards, input, output):
    """Words run on every rank: ``[apptainer exec ... IMAGE] hpcmem bind ... hpcmem collectives``."""
    return in_image(collectives_words(wildcards, output), input)


def get_native_collectives_command(wildcards, input, output):
    """Words of the same point run natively, for the native-against-container comparison."""
    return collectives_words(wildcards, output)(get_hpcmem(wildcards, input))


def get_train_command(wildcards, input, output):
    """Words of one training job: ``[apptainer exec --nv ... IMAGE] hpcmem train ...``."""
    return in_image(
        lambda hpcmem: [
            hpcmem, "train", "--model", wildcards.model, "--policy", get_policy(wildcards),
            *get_train_options(wildcards), "--skip-if-no-gpu", "--output", output.records,
        ],
        input,
    )  # fmt: skip


def image_spec(wildcards):
    """The CPU or GPU image spec named by ``wildcards.image``."""
    return CONTAINERS.gpu if wildcards.image == CONTAINERS.gpu.name else CONTAINERS.cpu


def get_container_definition(wildcards):
    """The definition file of image ``wildcards.image``."""
    return str(image_spec(wildcards).definition)


def get_container_build_options(wildcards):
    """Options of build_container.py for image ``wildcards.image``."""
    spec = image_spec(wildcards)
    options = ["--name", spec.name, "--definition", str(spec.definition), "--image-dir",
               str(CONTAINERS.image_dir), "--runtime", CONTAINERS.runtime, "--context",
               SOURCE_DIR]  # fmt: skip
    for name, value in spec.build_args.items():
        options += ["--build-arg", f"{name}={value}"]
    if spec.prebuilt:
        options += ["--prebuilt", str(spec.prebuilt)]
    return options + (["--gpu"] if spec.gpu else []) + (["--required"] if CONTAINERS.required else [])


def benchmark_inputs(gpu):
    """An input function of a benchmark rule: this run's environment (the installed wheel)
    and, when images are used, the run's reference to the benchmark's image."""
    name = (CONTAINERS.gpu if gpu else CONTAINERS.cpu).name

    def inputs(wildcards):
        found = {"venv": rules.install_wheel.output.venv}
        if CONTAINERS.enabled:
            found["image"] = rules.build_container.output.ref.format(image=name)
        return found

    return inputs


def in_image(words, input):
    """The command ``words(hpcmem)`` as a job runs it: through ``apptainer exec`` with the
    image's own ``hpcmem`` when the run uses the image, else with this run's environment."""
    image = ImageRef.read(input.image) if CONTAINERS.enabled else None
    if image is None or image.image is None:
        return words(get_hpcmem(None, input))
    return CONTAINERS.exec_command(words("hpcmem"), image)


def compare_native():
    """Whether the collectives points also run natively (images in use, and asked for)."""
    return CONTAINERS.enabled and CONTAINERS.compare_native and config["collectives"]["enabled"]


def get_native_records(wildcards):
    """The record files of the native comparison points ([] without a comparison)."""
    if not compare_native():
        return []
    return [rules.run_collectives_native.output.records.format(**p) for p in collectives_points()]


def get_native_summary(wildcards):
    """The summary of the native comparison points ([] without a comparison)."""
    return rules.aggregate_native.output.summary if compare_native() else []


def report_images():
    """Say which image each benchmark of this run used, or why it ran natively."""
    for path in sorted(glob.glob(rules.build_container.output.ref.format(image="*"))):
        image = ImageRef.read(path)
        if image.image:
            print(f"hpcmem: image {image.name}: {image.image} ({image.digest})")
        else:
            print(f"hpcmem: {image.name} ran natively: {image.reason}")


def get_all_records(wildcards):
    """Every record file of the sweep (collectives and training points)."""
    collectives = [rules.run_collectives.output.records.format(**p) for p in collectives_points()]
    train = [rules.run_train.output.records.format(**p) for p in train_points()]
    return collectives + train


def report_verdict():
    """When this invocation asked for the verdict: print its short summary (counts, failing
    and noisy figures, where the report and the full table are), and fail the workflow on a
    regression (check.fail_on_regression)."""
    if not any(job.rule.name == "check_regressions" for job in workflow.dag.jobs):
        return
    report_html = rules.render_report.output.report
    verdict_table = rules.check_regressions.output.verdict
    verdict = read_verdict(rules.check_regressions.output.verdict_json)
    html = os.path.abspath(report_html) if os.path.exists(report_html) else None
    print("\n" + "\n".join(summary_lines(verdict, report=html,
                                          table=os.path.abspath(verdict_table))) + "\n")
    with open(rules.check_regressions.output.status) as status:
        regression = status.read().strip() != "0"
    if regression and config["check"]["fail_on_regression"]:
        raise WorkflowError(
            f"hpcmem check found a regression in run {config['run_id']}: see {verdict_table}"
        )
