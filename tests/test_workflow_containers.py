"""The workflow and container.enabled: the plan resolved at parse time, the build_container
rule in the DAG, and the `apptainer exec` command lines of the benchmark rules.

No Apptainer/Singularity can be installed on these machines. `true` without a runtime is
run for real; where a runtime must be on PATH it is a stand-in script used only by dry
runs (`snakemake -n -p` executes nothing), which check the DAG and the generated commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IMAGES = Path("results", "images")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory holding a copy of the tiny test config."""
    work = tmp_path / "work"
    shutil.copytree(REPO / ".test" / "config", work / "config")
    return work


def snakemake(workdir: Path, *args: str, path: str) -> subprocess.CompletedProcess:
    """The real snakemake on the local profile with ``path`` as PATH; all output in stdout."""
    command = [str(BIN / "snakemake"), "--profile", str(REPO / "profiles" / "local"),
               "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
               *args]  # fmt: skip
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PATH": path})  # fmt: skip


def host_path() -> str:
    """PATH with the project's venv first and no container runtime (none exists here)."""
    return f"{BIN}{os.pathsep}{os.environ['PATH']}"


def runtime_path(tmp_path: Path) -> tuple[str, Path]:
    """PATH with a stand-in ``apptainer`` first (dry runs only: it is never executed)."""
    folder = tmp_path / "runtime"
    folder.mkdir()
    script = folder / "apptainer"
    script.write_text("#!/bin/sh\necho 'stand-in apptainer: not for real runs' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return f"{folder}{os.pathsep}{host_path()}", script


def set_config(workdir: Path, **sections) -> None:
    """Update sections of the working directory's config/config.yaml."""
    path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config))


def test_enabled_true_without_a_runtime_stops_before_any_job(workdir: Path):
    set_config(workdir, container={"enabled": True})
    result = snakemake(workdir, "--cores", "1", path=host_path())  # a real run
    assert result.returncode != 0
    assert "config container.enabled is true but neither apptainer nor singularity is on PATH" in (
        result.stdout
    )
    assert "rule " not in result.stdout and not (workdir / "results").exists()


def test_auto_without_a_runtime_says_it_runs_natively(workdir: Path):
    result = snakemake(workdir, "-n", "-p", path=host_path())
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("hpcmem: container.enabled=auto: no apptainer or singularity") == 1
    assert "build_container" not in result.stdout and " exec " not in result.stdout


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {w[0]: int(w[1]) for w in (line.split() for line in table.splitlines()) if
            len(w) == 2 and w[1].isdigit()}  # fmt: skip


def test_with_a_runtime_the_images_are_built_first(workdir: Path, tmp_path: Path):
    path, runtime = runtime_path(tmp_path)
    result = snakemake(workdir, "-n", "-p", path=path)
    assert result.returncode == 0, result.stdout
    assert f"hpcmem: container.enabled=auto: running in images through {runtime}" in result.stdout
    assert job_counts(result.stdout)["build_container"] == 2  # CPU and GPU images
    jobs = result.stdout.split("\nrule ")
    (cpu_build,) = [j for j in jobs if j.startswith("build_container") and "image=hpcmem-cpu" in j]
    assert f"input: {REPO / 'containers' / 'hpcmem-cpu.def'}" in cpu_build
    for job in (j for j in jobs if j.startswith("run_collectives")):
        assert f"input: {IMAGES / 'hpcmem-cpu.sif'}, {IMAGES / 'hpcmem-cpu.digest.json'}\n" in job
    (train,) = [j for j in jobs if j.startswith("run_train")]
    assert f"input: {IMAGES / 'hpcmem.sif'}, {IMAGES / 'hpcmem.digest.json'}\n" in train
    assert job_counts(result.stdout)["build_wheel"] == 1  # aggregation runs on the host

    set_config(workdir, train={"enabled": False})  # no training: no GPU image
    result = snakemake(workdir, "-n", path=path)
    assert job_counts(result.stdout)["build_container"] == 1
    assert "image=hpcmem-cpu" in result.stdout and "image=hpcmem\n" not in result.stdout


def test_benchmark_commands_run_through_apptainer_exec(workdir: Path, tmp_path: Path):
    path, runtime = runtime_path(tmp_path)
    images = workdir / IMAGES
    images.mkdir(parents=True)
    for name in ("hpcmem-cpu", "hpcmem"):  # built images: the DAG goes straight to the points
        (images / f"{name}.sif").write_text(f"{name} image\n")
        (images / f"{name}.digest.json").write_text(json.dumps({"digest": f"sha256:{name}"}))
    result = snakemake(workdir, "-n", "-p", path=path)
    assert result.returncode == 0, result.stdout
    assert "build_container" not in job_counts(result.stdout)
    env = f"--env HPCMEM_CONTAINER_IMAGE={IMAGES / 'hpcmem-cpu.sif'}," \
          "HPCMEM_CONTAINER_DIGEST=sha256:hpcmem-cpu"  # fmt: skip
    assert (
        "MEMKIND_HBW_NODES=0 mpirun --oversubscribe --allow-run-as-root --bind-to none -n 2 "
        f"{runtime} exec --bind {workdir} {env} {IMAGES / 'hpcmem-cpu.sif'} "
        "hpcmem bind --skip-unavailable -- hbw -- hpcmem collectives --op allreduce --buffer hbw "
        "--min-size 8 --max-size 1K --iterations 20 --warmup 2 --output "
        "results/e2e/collectives/allreduce/hbw/ranks2/hbw.jsonl > "
    ) in result.stdout
    assert (
        f"{runtime} exec --nv --bind {workdir} --env HPCMEM_CONTAINER_IMAGE="
        f"{IMAGES / 'hpcmem.sif'},HPCMEM_CONTAINER_DIGEST=sha256:hpcmem {IMAGES / 'hpcmem.sif'} "
        "hpcmem train --model transformer --policy hpcmem"
    ) in result.stdout

    set_config(workdir, container={"enabled": False})  # a runtime, but natively on request
    result = snakemake(workdir, "-n", "-p", path=path)
    assert result.returncode == 0, result.stdout
    assert "hpcmem: container.enabled=false: running natively" in result.stdout
    assert " exec " not in result.stdout
    assert "-n 2 results/e2e/build/venv/bin/hpcmem bind --skip-unavailable -- hbw --" in (
        result.stdout
    )


def test_build_container_script_records_the_digest_next_to_the_image(tmp_path: Path):
    # The stand-in writes the image it is asked for (`apptainer build --force IMAGE DEF`), as
    # in test_containers.py: what is checked is the digest file the rule's script writes.
    runtime = tmp_path / "apptainer"
    runtime.write_text('#!/bin/sh\necho "image of $(basename "$4")" > "$3"\n')
    runtime.chmod(runtime.stat().st_mode | stat.S_IXUSR)
    image, digest_file = tmp_path / "images" / "hpcmem-cpu.sif", tmp_path / "images" / "d.json"
    script = REPO / "workflow" / "scripts" / "build_container.py"
    definition = REPO / "containers" / "hpcmem-cpu.def"
    args = [definition, image, digest_file, runtime, REPO]
    subprocess.run([sys.executable, str(script), *map(str, args)], check=True, timeout=60)
    recorded = json.loads(digest_file.read_text())
    assert recorded["digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    assert recorded["image"] == str(image) and recorded["runtime"] == str(runtime)
