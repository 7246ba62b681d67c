"""The workflow's configuration: schema validation, shell-metacharacter rejection, dry runs.

Schema cases run in-process through ``snakemake.utils.validate`` (what the workflow calls);
the checks of ``rules/common.smk`` and the injection cases run the real ``snakemake``.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from container_image import without_runtime
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

#: payloads that would run a command if a value reached a shell unquoted
INJECTIONS = ("x; rm -rf /", "$(touch {canary})", "`touch {canary}`", "a|touch {canary}", "a\nb")

#: (path in the config, a valid value of that field) for every string that reaches a command
STRING_FIELDS = [
    (("run_id",), "nightly"),
    (("output_dir",), "results"),
    (("container", "cpu_definition"), "containers/hpcmem-cpu.def"),
    (("container", "gpu_definition"), "containers/hpcmem.def"),
    (("container", "image_dir"), "results/images"),
    (("container", "cpu_image"), "images/hpcmem-cpu.sif"),
    (("container", "gpu_image"), "images/hpcmem.sif"),
    (("container", "mirror"), "http://deb.debian.org/debian"),
    (("container", "gpu_base"), "nvidia/cuda:12.6.3-devel-ubuntu24.04"),
    (("container", "pip_index"), "https://pypi.org/simple"),
    (("container", "wheelhouse"), "wheels"),
    (("collectives", "ops", 0), "allreduce"),
    (("collectives", "buffers", 0), "numpy"),
    (("collectives", "min_size"), "8"),
    (("collectives", "max_size"), "1M"),
    (("collectives", "bindings", 0), "cores"),
    (("collectives", "custom_bindings", "node0"), "--cpunodebind=0 --membind=0"),
    (("collectives", "emulate_hbw"), "0"),
    (("train", "models", 0), "transformer"),
    (("train", "params", 0), "125M"),
    (("train", "policies", 0), "cuda"),
    (("train", "policy_files", "mine"), "config/mine.yaml"),
    (("train", "gpu_budgets", 0), "8G"),
    (("check", "references"), "config/references.yaml"),
    (("check", "history"), "results/history"),
]


def check(config: dict) -> dict:
    """Validate ``config`` as the workflow does (defaults filled in); return it."""
    validate(config, schema=str(SCHEMA))
    return config


def with_value(path: tuple, value) -> dict:
    """A minimal config holding ``value`` at ``path``."""
    config: dict = {}
    node = config
    for key, following in itertools.pairwise(path):
        node = node.setdefault(key, [] if isinstance(following, int) else {})
    if isinstance(node, list):
        node.append(value)
    else:
        node[path[-1]] = value
    return config


def snakemake(workdir: Path, *args: str, timeout: float = 120, wrap=list
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """Run the real snakemake on the workflow in ``workdir`` (``wrap`` wraps the command
    line); its output is all in stdout."""
    return subprocess.run(
        wrap([str(SNAKEMAKE), "--snakefile", str(REPO / "workflow" / "Snakefile"),
              "--directory", str(workdir), *args]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=REPO,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory holding a copy of the default config and references, run natively
    (whether the host has a container runtime is test_workflow_containers.py's subject)."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "config" / "references.yaml").touch(exist_ok=True)
    config = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    config["container"]["enabled"] = False
    write_config(tmp_path, config)
    return tmp_path


def write_config(workdir: Path, config: dict) -> None:
    """Replace the working directory's config/config.yaml."""
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def test_empty_config_gets_every_default():
    config = check({})
    assert config["output_dir"] == "results"
    assert config["collectives"]["ops"] == ["allreduce", "bcast", "gather"]
    assert config["collectives"]["custom_bindings"] == {}
    assert config["train"]["policies"] == ["cuda", "um", "hpcmem"]
    assert config["container"]["enabled"] == "auto"
    assert config["check"]["fail_on_regression"] is True


def test_every_schema_key_has_type_description_and_default():
    schema = yaml.safe_load(SCHEMA.read_text())

    def walk(properties: dict, prefix: str):
        for name, sub in properties.items():
            assert "description" in sub, f"{prefix}{name}: no description"
            assert "default" in sub, f"{prefix}{name}: no default"
            assert {"type", "$ref", "enum", "oneOf"} & sub.keys(), f"{prefix}{name}: no type"
            if "properties" in sub:
                assert sub.get("additionalProperties") is False, f"{prefix}{name}: open object"
                walk(sub["properties"], f"{prefix}{name}.")

    assert schema["additionalProperties"] is False
    walk(schema["properties"], "")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"collectives": {"ops": ["allgatherv"]}}, "'allgatherv' is not one of"),
        ({"collectives": {"buffers": ["gpu"]}}, "'gpu' is not one of"),
        ({"train": {"models": ["bert"]}}, "'bert' is not one of"),
        ({"collectives": {"tasks_per_node": ["2"]}}, "'2' is not of type 'integer'"),
        ({"collectives": {"tasks_per_node": 2}}, "2 is not of type 'array'"),
        ({"train": {"steps": "ten"}}, "'ten' is not of type 'integer'"),
        ({"collectives": {"enabled": "yes"}}, "'yes' is not of type 'boolean'"),
        ({"collectives": {"tasks_per_node": [0]}}, "0 is less than the minimum of 1"),
        ({"collectives": {"nodes": [-2]}}, "-2 is less than the minimum of 1"),
        ({"collectives": {"min_size": 0}}, "is not valid under any of the given schemas"),
        ({"collectives": {"max_size": -8}}, "is not valid under any of the given schemas"),
        ({"collectives": {"max_size": "0K"}}, "is not valid under any of the given schemas"),
        ({"collectives": {"iterations": 0}}, "0 is less than the minimum of 1"),
        ({"collectives": {"warmup": -1}}, "-1 is less than the minimum of 0"),
        ({"collectives": {"repeats": 0}}, "0 is less than the minimum of 1"),
        ({"collectives": {"repeats": "five"}}, "'five' is not of type 'integer'"),
        ({"collectives": {"yield_when_idle": "auto"}}, "'auto' is not of type 'boolean'"),
        ({"train": {"steps": 0}}, "0 is less than the minimum of 1"),
        ({"train": {"params": ["0"]}}, "'0' does not match"),
        ({"train": {"params": ["-125M"]}}, "'-125M' does not match"),
        ({"train": {"gpu_budgets": ["0G"]}}, "'0G' does not match"),
        ({"collectives": {"ops": []}}, "should be non-empty"),
        ({"colectives": {}}, "'colectives' was unexpected"),
        ({"collectives": {"op": ["bcast"]}}, "'op' was unexpected"),
        ({"collectives": {"ranks": [2]}}, "'ranks' was unexpected"),  # tasks_per_node
        ({"train": {"budget": "8G"}}, "'budget' was unexpected"),
        ({"train": {"gpus_per_node": [0]}}, "0 is less than the minimum of 1"),
        ({"train": {"device": "gpu"}}, "'gpu' is not one of ['cuda', 'cpu']"),
        ({"container": {"enabled": "maybe"}}, "'maybe' is not one of"),
        ({"collectives": {"custom_bindings": {"n0": "--membind=0 --cpubind=0"}}}, "does not match"),
        ({"collectives": {"custom_bindings": {"Bad-Name": "--membind=0"}}}, "does not match"),
        ({"collectives": {"emulate_hbw": "node0"}}, "is not valid under any of the given schemas"),
        ({"output_dir": "/etc"}, "'/etc' does not match"),
        ({"output_dir": "../../../../etc"}, "'../../../../etc' does not match"),
        ({"output_dir": "results/../../etc"}, "'results/../../etc' does not match"),
        ({"output_dir": ".."}, "'..' does not match"),
        ({"check": {"history": "/etc"}}, "'/etc' does not match"),
        ({"check": {"history": "results/.."}}, "'results/..' does not match"),
        # the history is a folder: how many runs to compare with is the references' history.last
        ({"check": {"history": {"last": 99999999999999999999}}}, "is not of type 'string'"),
    ],
)
def test_bad_values_are_rejected_naming_the_value(config: dict, message: str):
    with pytest.raises(WorkflowError) as error:
        check(copy.deepcopy(config))
    text = str(error.value)
    assert message in text
    section, fields = next(iter(config.items()))
    nested = isinstance(fields, dict) and fields
    location = f"['{section}']" + (f"['{next(iter(fields))}']" if nested else "")
    assert location in text or "was unexpected" in message  # names the field or the key


@pytest.mark.parametrize(("path", "valid"), STRING_FIELDS, ids=lambda v: ".".join(map(str, v)))
def test_shell_metacharacters_are_rejected_in_every_command_field(path, valid, tmp_path):
    check(with_value(path, valid))  # the field accepts its ordinary value
    for payload in INJECTIONS:
        bad = payload.format(canary=tmp_path / "pwned")
        for value in (bad, f"{valid} {bad}"):
            with pytest.raises(WorkflowError, match="Error validating config file"):
                check(with_value(path, value))


@pytest.mark.parametrize(
    ("section", "mapping", "value"),
    [("collectives", "custom_bindings", "--membind=0"), ("train", "policy_files", "p.yaml")],
)
def test_shell_metacharacters_are_rejected_in_names(section, mapping, value, tmp_path):
    check({section: {mapping: {"fine_name": value}}})
    for payload in INJECTIONS:
        name = payload.format(canary=tmp_path / "pwned")
        with pytest.raises(WorkflowError, match="does not match"):
            check({section: {mapping: {name: value}}})


@pytest.mark.parametrize(
    ("path", "payload", "message"),
    [
        (("run_id",), "r1$(touch {canary})", "does not match"),
        (("collectives", "custom_bindings", "n0"), "--membind=0; touch {canary}", "does not match"),
        (("train", "params", 0), "125M`touch {canary}`", "does not match"),
        (("check", "history"), "h && touch {canary}", "does not match"),
        (("run_id",), "r1\n", "config run_id: 'r1\\n' contains a control character"),
    ],
)
def test_injection_through_snakemake_stops_before_anything_runs(workdir, path, payload, message):
    canary = workdir / "pwned"
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = payload.format(canary=canary)
    write_config(workdir, config)
    result = snakemake(workdir, "--cores", "1")  # a real run, not a dry run
    assert result.returncode != 0
    assert message in result.stdout
    assert not canary.exists()
    assert not (workdir / "results").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--config", "foo=1"), "config foo: unknown key (accepted here: run_id, output_dir, "
                            "container, collectives, train, check; every key is described in "
                            "docs/configuration.md)"),
    (("--config", "collectives={ops: [bcast], repeat: 3}"),
     "config collectives.repeat: unknown key (nearest: repeats; every key is described in "
     "docs/configuration.md)"),
    (("--config", b"run_id=caf\xe9"), "config run_id: 'caf\\udce9' does not match the key's "
                                       "pattern (accepted: Names this run"),
], ids=["top", "nested", "not-utf8"])  # fmt: skip
def test_a_config_refusal_is_one_line_and_exit_2(workdir, args, message):
    result = snakemake(workdir, "--cores", "1", *args)  # a real run, not a dry run
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"hpcmem: error: {message}")
    assert len(result.stdout) < 1000 and "Traceback" not in result.stdout
    assert not (workdir / "results").exists()


def test_a_prebuilt_image_that_is_not_a_sif_is_named_on_a_host_without_a_runtime(workdir):
    (workdir / "images").mkdir()
    (workdir / "images" / "hpcmem-cpu.sif").write_text("a text file, not an image\n")
    before = sorted(workdir.rglob("*"))
    result = snakemake(workdir, "--cores", "1", "--config",
                       "container={enabled: auto, cpu_image: images/hpcmem-cpu.sif}",
                       wrap=without_runtime)
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines()[-1] == (
        f"hpcmem: error: config container.cpu_image: {workdir}/images/hpcmem-cpu.sif is not a "
        "SIF image (its bytes 32 to 41 are b'', where every SIF file holds b'SIF_MAGIC\\x00'): "
        "give one made by `apptainer build` or `singularity build`, or null to build one from "
        "container.cpu_definition")
    assert sorted(p for p in workdir.rglob("*") if ".snakemake" not in p.parts) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"collectives": {"bindings": ["hbw", "socket0"]}},
         "config collectives.bindings: 'socket0' is not one of none, cores, hbw, dram, interleave"),
        ({"train": {"policies": ["fast"]}},
         "config train.policies: 'fast' is not one of cuda, hpcmem, um"),
        ({"collectives": {"max_size": "3K"}},
         "config collectives.max_size: '3K' is not a power of two"),
        ({"collectives": {"min_size": "1M", "max_size": "4K"}},
         "config collectives.min_size: larger than collectives.max_size"),
        ({"collectives": {"enabled": False}, "train": {"enabled": False}},
         "config collectives.enabled, train.enabled: both false, nothing to run"),
        ({"output_dir": "a-file"}, "config output_dir: 'a-file' is a file, not a folder"),
        ({"collectives": {"custom_bindings": {"none": "--membind=0"}}},
         "config collectives.custom_bindings: 'none' is a built-in name"),
        ({"train": {"policy_files": {"cuda": "config/mine.yaml"}}},
         "config train.policy_files: 'cuda' is a built-in name"),
        ({"check": {"history": "a-file"}},
         "config check.history: 'a-file' is a file, not a folder"),
        ({"train": {"nodes": [1, 2], "gpus_per_node": [1, 2]}},
         "config train.nodes, train.gpus_per_node: 1 x 2 and 2 x 1 are both 2 GPUs"),
        ({"train": {"gpus_per_node": [3]}},
         "config train.models (transformer's own batch): 8 samples do not split evenly "
         "between 3 GPUs"),
        ({"train": {"device": "cpu", "policies": ["cuda", "um"]}},
         "config train.policies: um with train.device cpu (accepted on the cpu device: "
         "cuda only)"),
    ],
)
def test_workflow_checks_name_the_key(workdir, change, message):
    (workdir / "a-file").write_text("not a folder\n")
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    for section, values in change.items():
        if isinstance(values, dict):
            config[section].update(values)
        else:
            config[section] = values
    write_config(workdir, config)
    result = snakemake(workdir, "-n")
    assert result.returncode != 0
    assert message in result.stdout


def test_custom_binding_reaches_the_command_as_one_quoted_argument(workdir):
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["collectives"].update(
        bindings=["node0"], custom_bindings={"node0": "--cpunodebind=0 --membind=0"}
    )
    config["train"]["enabled"] = False
    write_config(workdir, config)
    result = snakemake(workdir, "-n", "-p", "--profile", str(REPO / "profiles" / "local"))
    assert result.returncode == 0, result.stdout
    assert ("bind --skip-unavailable --name node0 -- '--cpunodebind=0 --membind=0' --"
            in result.stdout)  # the records name the binding node0, as its folder does
    assert "collectives/allreduce/numpy/ranks=2/binding=node0.jsonl" in result.stdout


def job_counts(output: str) -> dict[str, int]:
    """The ``Job stats`` table of a snakemake dry run as {rule: count}."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def test_dry_run_of_the_default_config_lists_every_point(workdir):
    config = check(copy.deepcopy(yaml.safe_load((REPO / "config" / "config.yaml").read_text())))
    sweep, train = config["collectives"], config["train"]
    # natively, as on a host without a container runtime (test_workflow_containers.py: with one)
    result = snakemake(workdir, "-n", "-p", "--profile", str(REPO / "profiles" / "local"),
                       wrap=without_runtime)
    assert result.returncode == 0, result.stdout
    points = len(sweep["ops"]) * len(sweep["buffers"]) * len(sweep["nodes"]) * len(
        sweep["tasks_per_node"]) * len(sweep["bindings"])
    trains = len(train["models"]) * len(train["params"]) * len(train["policies"]) * len(
        train["gpu_budgets"]
    )
    assert (points, trains) == (12, 6)  # 3 ops x 2 buffers x 1 x 1 layout x 2 bindings; 2 x 3
    assert job_counts(result.stdout) == {
        "build_wheel": 1, "install_wheel": 1, "run_collectives": points, "run_train": trains,
        "aggregate_results": 1, "check_regressions": 1, "render_report": 1, "all": 1,
        "total": points + trains + 6,
    }
    for op, buffer, binding in itertools.product(sweep["ops"], sweep["buffers"], sweep["bindings"]):
        assert f"collectives/{op}/{buffer}/ranks=2/binding={binding}.jsonl" in result.stdout
        assert f"--op {op} --buffer {buffer}" in result.stdout
    assert "MEMKIND_HBW_NODES=0 mpirun --oversubscribe" in result.stdout
    assert result.stdout.count("--skip-if-no-gpu") == trains
    for policy in train["policies"]:  # params: default, each model's own count
        assert f"train/transformer/params=125000000/budget=none/policy={policy}.jsonl" in (
            result.stdout)
        assert f"train/cnn/params=25557032/budget=none/policy={policy}.jsonl" in result.stdout


def test_the_local_profile_refuses_a_multi_node_point_before_any_job(workdir):
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["collectives"].update(nodes=[1, 2], tasks_per_node=[1])
    write_config(workdir, config)
    result = snakemake(workdir, "--profile", str(REPO / "profiles" / "local"))
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines()[-1] == (
        "hpcmem: error: config collectives.nodes: 2: the local executor runs every point on "
        "this one machine (accepted here: 1); multi-node points need a profile with `executor: "
        "slurm`")
    assert not (workdir / "results").exists()
    # the same points with ranks on one node list as before, each in its own folder
    result = snakemake(workdir, "-n", "--profile", str(REPO / "profiles" / "local"))
    assert "collectives/allreduce/numpy/ranks=2/nodes=2/binding=none.jsonl" in result.stdout
    assert "collectives/allreduce/numpy/ranks=1/binding=none.jsonl" in result.stdout


def test_dry_run_in_a_fresh_clone_needs_no_profile(tmp_path: Path):
    """`snakemake -n --cores 2` where a clone puts the repository: the rules' own resources
    (the MPI launcher among them) are enough to list the default sweep."""
    clone = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["snakemake", "-n", "--cores", "2"], cwd=clone, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout
    counts = job_counts(result.stdout)
    assert (counts["run_collectives"], counts["run_train"]) == (12, 6)
    assert "mpi=mpiexec" in result.stdout


def test_make_run_script_starts_a_fresh_timestamped_run():
    result = subprocess.run(
        [str(REPO / "tools" / "run-workflow.sh"), "-n"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd="/",
    )
    assert result.returncode == 0, result.stdout
    run_id = re.search(r"^hpcmem: workflow run (\d{8}T\d{6}Z) ", result.stdout, re.MULTILINE)[1]
    assert f"results/{run_id}/build/wheelhouse" in result.stdout
    assert job_counts(result.stdout)["run_collectives"] == 12


ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
    for previous, name in itertools.pairwise("abcdefgh")
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + ALIAS_BOMB.encode(),
         "config/config.yaml:2: not valid YAML (aliases (*name) are not accepted)"),
        (b"run_id: caf\xe9\n", "config/config.yaml: not UTF-8 text (byte 0xe9 at offset 11)"),
        (b"\x7fELF\x02\x01\x01\x00", "config/config.yaml: not a text file (NUL byte at offset 7)"),
    ],
)
def test_config_file_not_text_or_with_aliases_is_refused_at_once(workdir, content, message):
    (workdir / "config" / "config.yaml").write_bytes(content)
    started = time.monotonic()
    result = snakemake(workdir, "-n", timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode != 0
    assert f"config file {message}" in result.stdout
    assert len(result.stdout) < 5000


def test_a_config_file_that_is_a_device_is_refused_at_once(workdir):
    (workdir / "config" / "config.yaml").unlink()
    (workdir / "config" / "config.yaml").symlink_to("/dev/zero")  # read for ever
    result = snakemake(workdir, "-n", timeout=60)
    assert result.returncode == 2
    assert result.stdout.splitlines()[-1] == ("hpcmem: error: config file config/config.yaml: "
                                              "not a regular file (a config file is YAML text)")


def test_common_smk_holds_only_loading_validation_constraints_and_small_helpers():
    """What the rules compute lives in hpcmem/workflow/, with tests of its own."""
    lines = (REPO / "workflow" / "rules" / "common.smk").read_text().splitlines()
    assert len(lines) <= 120, f"common.smk has {len(lines)} lines (at most 120)"
