"""Every container operation of the workflow, against the real Apptainer, through the one
module that performs them (hpcmem.workflow.containers.apptainer, spython's client
underneath): the runtime's version, a build, an image's labels and architecture, a command
run in the suite's image, and each failure as one ContainerError line. Skipped without a
runtime."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from container_image import BuiltImage

from hpcmem.workflow.containers import (
    ContainerError,
    build,
    exec_command,
    execute,
    host_arch,
    image_arch,
    labels,
    runtime_version,
)

#: an image of one file, built in a second: no bootstrap, no %post
TINY = """Bootstrap: scratch

%files
    marker /marker

%labels
    org.opencontainers.image.title hpcmem-tiny
"""


def one_line(error: pytest.ExceptionInfo) -> str:
    """The error's message, checked to be one line."""
    message = str(error.value)
    assert message and "\n" not in message, message
    return message


def test_the_version_is_the_runtimes_own(apptainer: str) -> None:
    printed = subprocess.run([apptainer, "--version"], capture_output=True, text=True, check=True)
    assert runtime_version(apptainer) == printed.stdout.split()[-1]


def test_an_image_builds_and_says_what_it_is(apptainer: str, tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("hpcmem\n")
    (tmp_path / "tiny.def").write_text(TINY)
    image, log = tmp_path / "tiny.sif", tmp_path / "build.log"
    with open(log, "w") as handle:
        build(apptainer, tmp_path / "tiny.def", image, build_args={}, binds=(),
              context=tmp_path, log=handle)  # fmt: skip
    assert image.is_file()
    text = log.read_text()
    assert text.startswith("+ singularity build --force --fakeroot")  # spython's command line
    assert "INFO:    Build complete" in text  # the runtime's own lines, not --quiet
    found = labels(apptainer, image)
    assert found["org.opencontainers.image.title"] == "hpcmem-tiny"
    assert found["org.label-schema.build-arch"] == host_arch() == image_arch(apptainer, image)


def test_a_command_runs_in_the_suite_image(apptainer: str, cpu_image: BuiltImage,
                                           tmp_path: Path) -> None:  # fmt: skip
    marker = tmp_path / "marker"
    marker.write_text("bound\n")
    image = cpu_image.ref.image
    version = execute(apptainer, image, ["python", "-c", "import platform; "
                                         "print(platform.python_version())"])  # fmt: skip
    assert version.strip() == cpu_image.ref.libraries["python"]
    assert execute(apptainer, image, ["cat", str(marker)], binds=[str(tmp_path)]) == "bound\n"
    with pytest.raises(ContainerError) as error:
        execute(apptainer, image, ["python", "-c", "raise SystemExit('no luck')"])
    assert one_line(error).endswith("exited 1: no luck")


def test_the_hybrid_mpi_form_puts_the_launcher_in_front() -> None:
    words = exec_command("/usr/bin/apptainer", "/i/cpu.sif", ["hpcmem", "collectives"],
                         binds=["/work"], env={"A": "1"}, nv=True,
                         launcher=["srun", "--mpi=pmix", "-n", "2"])  # fmt: skip
    assert words == ["srun", "--mpi=pmix", "-n", "2", "/usr/bin/apptainer", "exec", "--nv",
                     "--bind", "/work", "--env", "A=1", "/i/cpu.sif", "hpcmem", "collectives"]


def test_every_failure_is_one_line_of_ours(apptainer: str, tmp_path: Path) -> None:
    not_an_image = tmp_path / "not.sif"
    not_an_image.write_text("no image\n")
    with pytest.raises(ContainerError) as error:
        labels(apptainer, not_an_image)
    assert one_line(error).startswith(f"{apptainer} inspect {not_an_image} failed: FATAL:")
    with pytest.raises(ContainerError) as error:
        execute(apptainer, not_an_image, ["true"])
    assert "exited 255: FATAL:" in one_line(error)
    with pytest.raises(ContainerError) as error:
        image_arch(apptainer, not_an_image)
    assert one_line(error).startswith(f"{not_an_image}: not a SIF image")
    (tmp_path / "broken.def").write_text(TINY)  # its %files source is missing
    with open(tmp_path / "build.log", "w") as log, pytest.raises(ContainerError) as error:
        build(apptainer, tmp_path / "broken.def", tmp_path / "x.sif", build_args={}, binds=(),
              context=tmp_path, log=log)  # fmt: skip
    assert one_line(error) == "exit status 255" and not (tmp_path / "x.sif").exists()
    with pytest.raises(ContainerError) as error:
        execute(apptainer, not_an_image, ["true"], binds=[str(tmp_path / "nowhere")])
    assert one_line(error).endswith("spython stopped (exit status 1)")  # its own refusal

    with pytest.raises(ContainerError) as error:
        runtime_version(str(tmp_path / "apptainer"))
    assert one_line(error) == f"{tmp_path / 'apptainer'}: no such runtime"
    alone = tmp_path / "bin"
    alone.mkdir()
    os.symlink(apptainer, alone / "apptainer")  # without the `singularity` spython runs
    with pytest.raises(ContainerError) as error:
        runtime_version(str(alone / "apptainer"))
    assert "no `singularity` beside it" in one_line(error)
