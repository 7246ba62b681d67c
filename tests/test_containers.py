"""Container images: definition files, container.enabled resolution, exec command lines.

No Apptainer/Singularity binary can be installed on these machines. The definition files
are checked with spython's recipe parser; the native path (auto without a runtime) runs
for real; the runtime's own behaviour is left to hosts that have one, and where a test
needs a runtime on PATH it is a small stand-in script, named as such.
"""

from __future__ import annotations

import hashlib
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from hpcmem.workflow.containers import ContainerError, build_image, find_runtime, resolve_container

REPO = Path(__file__).resolve().parents[1]
PIP = "/opt/venv/bin/pip install"


def recipe(name: str):
    (layer,) = SingularityParser(str(REPO / "containers" / name)).recipe.values()
    return layer


def commands(layer) -> str:
    return "\n".join(layer.install)


@pytest.mark.parametrize("name", ["hpcmem.def", "hpcmem-cpu.def"])
def test_definition_has_every_component(name: str) -> None:
    layer = recipe(name)
    post = commands(layer)
    for package in ("libmemkind-dev", "libnuma-dev", "numactl", "hwloc", "libpmix-dev",
                    "build-essential", "cmake", "python3-venv"):  # fmt: skip
        assert re.search(rf"\b{package}\b", post), f"{name}: {package} not installed"
    assert f"{PIP} --no-cache-dir -r /opt/hpcmem/src/requirements.txt" in post
    makefile_mpi4py = re.search(r"mpi4py==[\d.]+", (REPO / "Makefile").read_text())[0]
    assert f"--no-binary mpi4py {makefile_mpi4py}" in post  # built against the image's MPI
    assert f"{PIP} --no-cache-dir --no-build-isolation --no-deps /opt/hpcmem/src" in post
    copied = {line.split()[0] for line in layer.files}
    assert copied == {"pyproject.toml", "requirements.txt", "README.md", "native", "hpcmem"}
    assert all((REPO / path).exists() for path in copied)  # %files paths: repository root
    assert "PATH=/opt/venv/bin" in " ".join(layer.environ)
    assert "exec /opt/venv/bin/hpcmem" in layer.cmd
    assert "hpcmem info" in post  # %test, which spython folds into the install steps


def test_gpu_definition_builds_a_matching_open_mpi_on_cuda_devel() -> None:
    layer = recipe("hpcmem.def")
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-devel-ubuntu\d\d\.04", layer.fromHeader)
    post = commands(layer)
    host = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True).stdout
    host_version = re.search(r"Open MPI v([\d.]+)", host)[1]
    assert f"OMPI_VERSION={host_version}" in post  # the test cluster's Open MPI
    assert "--with-pmix=" in post and "--with-cuda=/usr/local/cuda" in post
    assert "--with-slurm" in post


def test_cpu_definition_uses_the_hosts_debian_open_mpi() -> None:
    layer = recipe("hpcmem-cpu.def")
    assert layer.fromHeader == "debian:12"
    assert re.search(r"\bopenmpi-bin\b", commands(layer))
    assert "https://download.pytorch.org/whl/cpu" in commands(layer)


def test_auto_without_a_runtime_runs_natively(tmp_path: Path, hpcmem_exe: str) -> None:
    plan = resolve_container({"container": {"enabled": "auto"}}, path=str(tmp_path))
    assert not plan.enabled and plan.runtime is None
    assert "no apptainer or singularity on PATH, running natively" in plan.reason
    assert plan.record() is None
    command = plan.exec_command([hpcmem_exe, "info", "--json"])
    assert command == [hpcmem_exe, "info", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    launched = plan.exec_command(["hpcmem", "collectives"], launcher=["srun", "-n", "2"])
    assert launched == ["srun", "-n", "2", "hpcmem", "collectives"]


def test_this_host_has_no_runtime_so_the_workflow_runs_natively() -> None:
    plan = resolve_container({"container": {"enabled": "auto"}})
    assert plan.enabled == (find_runtime() is not None)


@pytest.mark.parametrize("value", [True, "true"])
def test_true_without_a_runtime_fails_before_any_job(tmp_path: Path, value) -> None:
    with pytest.raises(ContainerError) as error:
        resolve_container({"container": {"enabled": value}}, path=str(tmp_path))
    assert str(error.value).startswith(
        "container.enabled is true but neither apptainer nor singularity is on PATH"
    )


@pytest.mark.parametrize("value", [False, "false"])
def test_false_is_native_even_with_a_runtime(tmp_path: Path, value) -> None:
    stand_in(tmp_path, "apptainer", "exit 0")
    plan = resolve_container({"container": {"enabled": value}}, path=str(tmp_path))
    assert not plan.enabled and plan.reason == "container.enabled=false: running natively"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_enabled_value_names_the_key(value) -> None:
    with pytest.raises(ContainerError, match=r"container.enabled: .* is not one of auto, true"):
        resolve_container({"container": {"enabled": value}}, path="")


def stand_in(folder: Path, name: str, body: str) -> Path:
    """A stand-in runtime executable (no Apptainer can be installed on these machines)."""
    script = folder / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_exec_command_lines_with_a_runtime(tmp_path: Path) -> None:
    runtime = stand_in(tmp_path, "apptainer", "exit 0")
    stand_in(tmp_path, "singularity", "exit 0")
    images = tmp_path / "images"
    config = {"container": {"enabled": "auto", "image_dir": str(images)}}
    plan = resolve_container(config, path=str(tmp_path), binds=["/work", "/scratch:/scratch"])
    assert plan.enabled and plan.runtime == str(runtime)  # apptainer preferred
    images.mkdir()
    (images / "hpcmem-cpu.sif").write_bytes(b"cpu image")
    (images / "hpcmem.sif").write_bytes(b"gpu image")
    cpu_digest = "sha256:" + hashlib.sha256(b"cpu image").hexdigest()
    gpu_digest = "sha256:" + hashlib.sha256(b"gpu image").hexdigest()

    mpi = plan.exec_command(["hpcmem", "bind", "hbw", "--", "hpcmem", "collectives"],
                            launcher=["srun", "-n", "2"])  # fmt: skip
    assert mpi == [
        "srun", "-n", "2", str(runtime), "exec",
        "--bind", "/work", "--bind", "/scratch:/scratch",
        "--env", f"HPCMEM_CONTAINER_IMAGE={images / 'hpcmem-cpu.sif'},"
        f"HPCMEM_CONTAINER_DIGEST={cpu_digest}",
        str(images / "hpcmem-cpu.sif"), "hpcmem", "bind", "hbw", "--", "hpcmem", "collectives",
    ]  # fmt: skip
    train = plan.exec_command(["hpcmem", "train"], gpu=True)
    assert train[:3] == [str(runtime), "exec", "--nv"]
    assert train[-3:] == [str(images / "hpcmem.sif"), "hpcmem", "train"]
    assert f"HPCMEM_CONTAINER_DIGEST={gpu_digest}" in train[train.index("--env") + 1]
    assert plan.record(gpu=True) == {"image": str(images / "hpcmem.sif"), "digest": gpu_digest}


def test_records_say_which_image_they_ran_in(tmp_path: Path) -> None:
    code = "import json, hpcmem.node.probe as p; print(json.dumps(p.current_container()))"
    env = {"HPCMEM_CONTAINER_IMAGE": "/images/cpu.sif", "HPCMEM_CONTAINER_DIGEST": "sha256:ab"}
    inside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)  # fmt: skip
    assert inside.stdout.strip() == '{"image": "/images/cpu.sif", "digest": "sha256:ab"}'
    native = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={}, check=True)  # fmt: skip
    assert native.stdout.strip() == "null"


def test_build_image_is_atomic_and_returns_the_digest(tmp_path: Path) -> None:
    # The stand-in writes the image it is asked for: `apptainer build --force IMAGE DEF`.
    runtime = stand_in(tmp_path, "apptainer", 'echo "image of $(basename "$4")" > "$3"')
    image = tmp_path / "images" / "hpcmem-cpu.sif"
    digest = build_image(REPO / "containers" / "hpcmem-cpu.def", image, runtime=str(runtime),
                         context=REPO)  # fmt: skip
    assert image.read_text() == "image of hpcmem-cpu.def\n"
    assert digest == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    assert sorted(p.name for p in image.parent.iterdir()) == ["hpcmem-cpu.sif"]


def test_failed_build_leaves_no_image(tmp_path: Path) -> None:
    runtime = stand_in(tmp_path, "apptainer", 'echo partial > "$3"; exit 3')
    image = tmp_path / "images" / "hpcmem.sif"
    with pytest.raises(ContainerError, match=r"building .*hpcmem\.sif from .*hpcmem\.def failed"):
        build_image(REPO / "containers" / "hpcmem.def", image, runtime=str(runtime), context=REPO)
    assert list(image.parent.iterdir()) == []
