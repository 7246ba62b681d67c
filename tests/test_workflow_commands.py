"""The command line of a benchmark job (hpcmem/workflow/commands.py, containers.py), for
points of real configs; the workflow's dry runs (test_workflow_config.py) print the same."""

from __future__ import annotations

import os
from pathlib import Path

from workflow_configs import load

from hpcmem.workflow.commands import collectives_command, run_env, train_command
from hpcmem.workflow.containers import (
    ContainerPlan,
    ImageRef,
    container_binds,
    resolve_container,
)
from hpcmem.workflow.points import collectives_points, train_points

REPO = Path(__file__).resolve().parents[1]
CUSTOM = {"collectives": {"bindings": ["node0"],
                          "custom_bindings": {"node0": "--cpunodebind=0 --membind=0"}},
          "train": {"params": ["1.3B"], "policies": ["mine"], "gpu_budgets": ["16G"],
                    "policy_files": {"mine": "config/mine.yaml"}}}


def test_a_collectives_job_binds_its_ranks_and_names_the_binding_as_its_folder() -> None:
    config = load("config/config.yaml", extra=CUSTOM)
    point = collectives_points(config)[0]
    assert collectives_command(config, point, "r.jsonl", "/v/bin/hpcmem") == [
        "/v/bin/hpcmem", "bind", "--skip-unavailable", "--name", "node0", "--",
        "--cpunodebind=0 --membind=0", "--", "/v/bin/hpcmem", "collectives", "--op", "allreduce",
        "--buffer", "numpy", "--min-size", "8", "--max-size", "64K", "--repeats", "5",
        "--output", "r.jsonl"]  # fmt: skip


def test_the_sweep_s_iterations_reach_every_collectives_job() -> None:
    config = load("config/config.yaml", ".test/config/config.yaml")
    words = collectives_command(config, collectives_points(config)[0], "r.jsonl")
    assert words[words.index("collectives"):] == [
        "collectives", "--op", "allreduce", "--buffer", "numpy", "--min-size", "8",
        "--max-size", "1K", "--iterations", "20", "--warmup", "2", "--repeats", "5",
        "--output", "r.jsonl"]  # fmt: skip
    assert words[:7] == ["hpcmem", "bind", "--skip-unavailable", "--name", "hbw", "--", "hbw"]


def test_a_training_job_gets_its_point_and_a_policy_file_s_path() -> None:
    config = load("config/config.yaml", extra=CUSTOM)
    transformer, _cnn = train_points(config)
    assert train_command(config, transformer, "r.jsonl") == [
        "hpcmem", "train", "--model", "transformer", "--params", "1300000000",
        "--gpu-budget", "17179869184", "--policy", "config/mine.yaml", "--steps", "10",
        "--warmup", "3", "--skip-if-no-gpu", "--output", "r.jsonl"]  # fmt: skip


def test_the_job_environment_names_run_commit_emulated_hbw_and_yielding() -> None:
    config = load("config/config.yaml", extra={"run_id": "nightly"})
    assert run_env(config, "abc123") == ["HPCMEM_RUN_ID=nightly", "HPCMEM_GIT_SHA=abc123",
                                         "MEMKIND_HBW_NODES=0"]
    config = load("config/config.yaml", extra={"run_id": "r", "collectives": {
        "emulate_hbw": None, "yield_when_idle": True}})
    assert run_env(config, "") == ["HPCMEM_RUN_ID=r", "OMPI_MCA_mpi_yield_when_idle=1"]


def test_the_output_folder_is_mounted_when_it_lies_outside_the_working_directory() -> None:
    here = os.getcwd()
    assert container_binds(here, "results") == [here]
    assert container_binds(here, "/scratch/results") == [here, "/scratch/results"]


def plan_with_images(tmp_path: Path) -> ContainerPlan:
    """The plan of a host with Apptainer (none is needed to build the command lines)."""
    native = resolve_container({"container": {"enabled": False}}, source_dir=REPO, path="",
                               binds=["/work"])
    return ContainerPlan(enabled=True, required=False, runtime="/usr/bin/apptainer",
                         reason="", image_dir=tmp_path, cpu=native.cpu, gpu=native.gpu,
                         binds=("/work",))


def test_a_job_runs_in_its_image_when_it_has_one_else_natively(tmp_path: Path) -> None:
    plan = plan_with_images(tmp_path)
    built = tmp_path / "cpu.json"
    built.write_text(ImageRef(name="hpcmem-cpu", gpu=False, image="/i/cpu.sif",
                              digest="sha256:ab", runtime="/usr/bin/apptainer").to_json())
    native = tmp_path / "native.json"
    native.write_text(ImageRef(name="hpcmem-cpu", gpu=False, image=None, reason="no").to_json())
    words = lambda hpcmem: [hpcmem, "info"]  # noqa: E731
    assert plan.job_command(words, str(built), "/v/bin/hpcmem")[-3:] == [
        "/i/cpu.sif", "hpcmem", "info"]  # the image's own hpcmem
    assert plan.job_command(words, str(native), "/v/bin/hpcmem") == ["/v/bin/hpcmem", "info"]
    assert plan.job_command(words, None, "/v/bin/hpcmem") == ["/v/bin/hpcmem", "info"]
    assert plan.benchmark_image(gpu=True).name == "hpcmem"
    assert resolve_container({"container": {"enabled": False}}).benchmark_image(False) is None


def test_an_image_is_built_from_its_definition_with_its_arguments(tmp_path: Path) -> None:
    plan = plan_with_images(tmp_path)
    assert plan.image("hpcmem") is plan.gpu and plan.image("hpcmem-cpu") is plan.cpu
    assert plan.build_options("hpcmem", "/src") == [
        "--name", "hpcmem", "--definition", str(REPO / "containers" / "hpcmem.def"),
        "--image-dir", str(tmp_path), "--runtime", "/usr/bin/apptainer", "--context", "/src",
        "--build-arg", "BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04", "--gpu"]  # fmt: skip
    assert plan.build_options("hpcmem-cpu", "/src")[-6:] == [
        "--build-arg", "MIRROR=http://deb.debian.org/debian", "--build-arg", "DEBIAN=bookworm",
        "--download-wheels", "bookworm"]  # this host's pip makes the image's wheelhouse
