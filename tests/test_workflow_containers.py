"""The workflow in Apptainer images, for real: on the local profile and on the test Slurm
cluster (`srun --mpi=pmix apptainer exec IMAGE hpcmem bind ... hpcmem collectives ...`), with
the suite's CPU image, Debian 13 on this Debian 12 host (tests/container_image.py); that the
host's wheel cannot serve there and the image's own build does; what container.enabled does
when the image cannot be built, and on a host without a runtime (tests/container_image.py
masks it).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from container_image import (
    IMAGE_CACHE,
    IMAGE_DEBIAN,
    IMAGE_PYTHON,
    NO_MIRROR,
    BuiltImage,
    host_open_mpi,
    image_settings,
    leftovers,
    snakemake,
    without_runtime,
    workdir_with,
)
from slurm_cluster import SlurmCluster
from slurm_site import site_profile

from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record
from hpcmem.workflow.containers import (
    ContainerError,
    ImageRef,
    execute,
    host_arch,
    resolve_container,
    runtime_version,
)

REPO = Path(__file__).resolve().parents[1]
RUN = Path("results", "e2e")
BUILD_SCRIPT = REPO / "workflow" / "scripts" / "build_container.py"
#: two points (numpy and emulated-HBW buffers, memory bound to the HBW node), no training
SWEEP = {"collectives": {"ops": ["allreduce"], "bindings": ["hbw"], "max_size": 64},
         "train": {"enabled": False}}  # fmt: skip
SIZES = [8, 16, 32, 64]


def records(workdir: Path, *parts: str) -> list[dict]:
    """Every record under RUN/parts..., each checked against the schema."""
    found = [r for path in sorted(workdir.joinpath(RUN, *parts).rglob("*.jsonl"))
             for r in read_records(path)]  # fmt: skip
    assert found and [validate_record(r) for r in found] == [[]] * len(found)
    return found


def test_enabled_true_without_a_runtime_stops_before_any_job(tmp_path: Path) -> None:
    work = workdir_with(tmp_path, container={"enabled": True})
    result = snakemake(work, "--cores", "1", wrap=without_runtime)  # a real run
    assert result.returncode != 0
    assert "config container.enabled is true but neither apptainer nor singularity is on PATH" in (
        result.stdout
    )
    assert "rule " not in result.stdout and not (work / "results").exists()


def test_auto_without_a_runtime_says_once_that_it_runs_natively(tmp_path: Path) -> None:
    work = workdir_with(tmp_path, container={"enabled": "auto"})
    result = snakemake(work, "-n", "-p", wrap=without_runtime)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("hpcmem: container.enabled=auto: no apptainer or singularity") == 1
    assert "build_container" not in result.stdout and " exec " not in result.stdout


def test_a_definition_that_does_not_parse_stops_before_any_job(apptainer: str, tmp_path: Path):
    definition = tmp_path / "broken.def"
    definition.write_text("Bootstrap: debootstrap\nOSVersion: bookworm\n%psot\n    true\n")
    work = workdir_with(tmp_path / "work", container={"enabled": "auto",
                                                      "cpu_definition": str(definition)})
    result = snakemake(work, "--cores", "1")
    assert result.returncode != 0
    assert f"config container.cpu_definition: {definition}:3: unknown section %psot" in (
        result.stdout
    )
    assert "rule " not in result.stdout and not (work / "results").exists()


def test_dry_run_with_a_runtime_builds_the_images_first(apptainer: str, tmp_path: Path) -> None:
    work = workdir_with(tmp_path, container={"enabled": "auto"})
    result = snakemake(work, "-n")
    assert result.returncode == 0, result.stdout
    table = result.stdout.split("Job stats:", 1)[1]
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}
    points = 2 * 2  # allreduce, bcast x numpy, hbw (.test/config)
    # the CPU image, and the GPU image only where an NVIDIA driver is loaded (without one the
    # training points record skipped, never running in it)
    driver = Path("/proc/driver/nvidia").exists()
    assert counts["build_container"] == (2 if driver else 1)
    assert ("hpcmem: the GPU image is not built: no NVIDIA driver on this machine" in
            result.stdout) is not driver
    assert counts["run_collectives"] == counts["run_collectives_native"] == points
    assert counts["aggregate_native"] == 1
    assert f"hpcmem: container.enabled=auto: running in images through {apptainer}" in (
        result.stdout
    )


def build_script(*options: str, cwd: Path) -> subprocess.CompletedProcess:
    """workflow/scripts/build_container.py, as the build_container rule runs it."""
    return subprocess.run([sys.executable, str(BUILD_SCRIPT), *options], capture_output=True,
                          text=True, timeout=900, cwd=cwd)  # fmt: skip


def test_failed_build_auto_runs_natively_true_stops(apptainer: str, tmp_path: Path) -> None:
    options = ["--name", "hpcmem-cpu", "--definition", str(REPO / "containers" / "hpcmem-cpu.def"),
               "--image-dir", str(tmp_path / "images"), "--runtime", apptainer, "--context",
               str(REPO), "--build-arg", f"MIRROR={NO_MIRROR}",
               "--log", str(tmp_path / "build.log")]  # fmt: skip
    auto = build_script(*options, "--out", str(tmp_path / "auto.json"), cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    ref = ImageRef.read(tmp_path / "auto.json")
    assert ref.image is None and ref.reason.endswith(f"; build log: {tmp_path / 'build.log'}")
    # the build's stages as it went, then one line saying why it runs natively
    *stages, last = auto.stderr.splitlines()
    assert last == f"hpcmem: container.enabled=auto: hpcmem-cpu runs natively: {ref.reason}"
    assert stages and all(re.fullmatch(r"hpcmem: building hpcmem-cpu-\w+\.sif: .+ \(\d+ s\)",
                                       line) for line in stages), stages

    required = build_script(*options, "--required", "--out", str(tmp_path / "true.json"),
                            cwd=tmp_path)  # fmt: skip
    assert required.returncode == 1
    last = required.stderr.splitlines()[-1]
    assert last.startswith("hpcmem: container.enabled=true: building hpcmem-cpu-")
    assert last.endswith(f"; build log: {tmp_path / 'build.log'}")
    assert not (tmp_path / "true.json").exists()
    assert leftovers(tmp_path / "images") == []


def test_the_suite_image_is_debian_13_built_inside_itself(
    apptainer: str, cpu_image: BuiltImage, tmp_path: Path
) -> None:
    ref = cpu_image.ref
    image = Path(ref.image)
    assert image.parent == IMAGE_CACHE.absolute() and image.name == f"hpcmem-cpu-{ref.key}.sif"
    assert ref.arch == host_arch() == "amd64" and ref.runtime_version == runtime_version(apptainer)
    stamp = ImageRef.read(image.with_suffix(".json"))
    assert stamp.digest == ref.digest and stamp.built and stamp.build_seconds > 0
    how = f"built in {ref.build_seconds} s" if ref.built else "cached"
    assert f"hpcmem: image hpcmem-cpu: {image} ({how}, {ref.digest})" in cpu_image.output
    # its own release, Python and MPI, not the host's (Debian 12, 3.11, Open MPI 4.1)
    libraries = ref.libraries
    assert libraries["os"] == IMAGE_DEBIAN and libraries["python"].startswith(f"{IMAGE_PYTHON}.")
    assert libraries["mpi"].startswith("Open MPI v5.") and host_open_mpi().startswith("4.")
    assert libraries["hpcmem"] == importlib.metadata.version("hpcmem")
    for package in ("numpy", "mpi4py"):  # what the native jobs run, at the same pins
        assert libraries[package] == importlib.metadata.version(package)
    assert libraries["hbw_backend"] == f"umf {importlib.metadata.version('umf')}"  # the default
    assert ref.labels["org.opencontainers.image.title"] == "hpcmem-cpu"
    # the extensions link the image's own libraries; no compiler is left in the run stage
    linked = execute(apptainer, image, ["sh", "-c", "ldd /opt/venv/lib/python3*/site-packages/"
                                        "hpcmem/_hbw*.so /opt/venv/lib/python3*/site-packages/"
                                        "hpcmem/_timing*.so"])  # fmt: skip
    # both placement backends: pip's libumf (and the libhwloc it loads) in the venv, found
    # through _hbw's RUNPATH, and Debian 12's memkind
    assert re.search(r"libumf\.so\.1 => /opt/venv/lib/\S+/libumf\.so\.1 ", linked), linked
    assert re.search(r"libhwloc\.so\.15 => /opt/venv/lib/\S+/libhwloc\.so\.15 ", linked), linked
    assert re.search(r"libmemkind\.so\.0 => /\S+/libmemkind\.so\.0", linked), linked
    assert re.search(r"libmpi\.so\.40 => /\S+/libmpi\.so\.40", linked), linked
    assert "not found" not in linked
    # `hpcmem info` in the image: the backend serving the kinds, and the image it runs in
    info = json.loads(execute(apptainer, image, ["hpcmem", "info", "--json"]))
    backend = info["hbw_backend"]
    assert f"{backend['name']} {backend['version']}" == libraries["hbw_backend"]
    assert info["mpi"]["mpi4py"] == libraries["mpi4py"]
    assert info["container"]["inside"] == str(image)
    with pytest.raises(ContainerError, match="exited"):
        execute(apptainer, image, ["sh", "-c", "command -v gcc cc c++ cmake"])
    # pip read nothing but the session's wheelhouse (the build log is kept with the image)
    log = image.with_suffix(".log").read_text()
    assert "--no-index --find-links /opt/hpcmem/wheelhouse" in log
    assert "Looking in indexes" not in log and "Looking in links: /opt/hpcmem/wheelhouse" in log

    # the same definition, arguments, sources and wheels again: the cached image; from the
    # repository root, as `make run` runs it, so the check must not import the source tree
    config = {"container": image_settings(cpu_image.wheelhouse)}
    options = resolve_container(config, source_dir=REPO).build_options("hpcmem-cpu", str(REPO))
    started = time.monotonic()
    again = build_script(*options, "--out", str(tmp_path / "again.json"), cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert again.stderr == f"hpcmem: image hpcmem-cpu: {image} (cached, {ref.digest})\n"
    assert time.monotonic() - started < 60
    assert ImageRef.read(tmp_path / "again.json").built is False


@pytest.fixture(scope="module")
def local_run(cpu_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sweep in the session's image on the local profile (container.enabled: auto)."""
    work = workdir_with(tmp_path_factory.mktemp("local-images"), **copy.deepcopy(SWEEP),
                        container=image_settings(cpu_image.wheelhouse, enabled="auto"))
    result = snakemake(work)
    return {"work": work, "result": result}


def test_local_run_uses_the_cached_image_and_records_it(cpu_image: BuiltImage, local_run):
    result, work, image = local_run["result"], local_run["work"], cpu_image.ref
    assert result.returncode == 0, result.stdout
    assert f"hpcmem: image hpcmem-cpu: {image.image} (cached, {image.digest})" in result.stdout
    assert (f"mpirun --oversubscribe --allow-run-as-root --bind-to none -n 2 {image.runtime} exec "
            f"--bind {work} --env HPCMEM_CONTAINER_IMAGE={image.image}") in result.stdout
    bind = "hpcmem bind --skip-unavailable --name hbw -- hbw -- hpcmem collectives"
    assert f"{image.image} {bind}" in result.stdout
    inside = records(work, "collectives")
    assert len(inside) == 2 * len(SIZES)
    assert {json.dumps(r["container"], sort_keys=True) for r in inside} == {json.dumps({
        "image": image.image, "digest": image.digest, "runtime": "apptainer",
        "runtime_version": image.runtime_version}, sort_keys=True)}  # fmt: skip
    for record in inside:
        assert record["status"] == "ok" and record["validated"]
        assert record["mpi_library"] == image.libraries["mpi"]  # the image's Open MPI 5
        for rank in record["binding"]["per_rank"]:  # numactl in the image, measured in the rank
            assert rank["numactl"] == ["--cpunodebind=0", "--membind=0"]
            assert rank["mempolicy"] == {"mode": "bind", "nodes": [0]}
        if record["buffer"] == "hbw":
            assert record["placement"]["emulated"] and record["placement"]["hbw_fraction"] == 1.0


def test_local_run_compares_the_same_points_natively(local_run) -> None:
    work = local_run["work"]
    native = records(work, "native", "collectives")
    assert {r["container"] for r in native} == {None}
    point = lambda r: (r["op"], r["buffer"], r["size_bytes"])  # noqa: E731
    assert sorted(map(point, native)) == sorted(map(point, records(work, "collectives")))
    report = (work / RUN / "report" / "report.html").read_text()
    section = report[report.index('<section id="container">'):]
    section = section[:section.index("</section>")]
    assert "<h2>Native against container</h2>" in section
    assert "data:image/png;base64," in section
    row = (r'<tr><td>allreduce</td><td>float32</td><td class="num">2</td><td>hbw</td>'
           r'<td>(\w+)</td><td class="num">(\d+)</td>')
    rows = re.findall(row, section)
    assert sorted(rows) == sorted((b, str(s)) for b in ("hbw", "numpy") for s in SIZES)


#: loads one extension module from its file, as an import of it would
LOAD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("hpcmem._hbw", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print("loaded", sys.argv[1])
"""


def test_the_hosts_wheel_cannot_serve_in_the_image_its_own_build_does(
    apptainer: str, cpu_image: BuiltImage, local_run
) -> None:
    work, image = local_run["work"], cpu_image.ref.image
    (wheel,) = (work / RUN / "build" / "wheelhouse").glob("hpcmem-*.whl")  # the native jobs'
    assert "-cp311-cp311-linux_x86_64" in wheel.name
    refused = subprocess.run([apptainer, "exec", "--cleanenv", "--bind", str(work), image, "pip",
                              "install",
                              "--dry-run", "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode != 0
    assert "is not a supported wheel on this platform" in refused.stderr, refused.stderr
    unpacked = work / "host-wheel"
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [m for m in archive.namelist() if m.startswith("hpcmem/_hbw.")]
        extension = archive.extract(member, unpacked)
    with pytest.raises(ContainerError) as error:  # the host's build, loaded by Python 3.13
        execute(apptainer, image, ["python", "-c", LOAD, extension], binds=[str(work)])
    assert re.search(r"exited 1: ImportError: .*(3\.11|undefined symbol)", str(error.value))
    own = execute(apptainer, image, ["sh", "-c", 'python -c "$0" /opt/venv/lib/python3*/'
                                     'site-packages/hpcmem/_hbw.*.so', LOAD])  # fmt: skip
    assert re.match(r"loaded \S+/_hbw\.cpython-313-x86_64-linux-gnu\.so$", own), own


def test_auto_runs_natively_when_the_image_cannot_be_built(apptainer: str, tmp_path: Path):
    work = workdir_with(tmp_path, **copy.deepcopy(SWEEP),
                        container={"enabled": "auto", "mirror": NO_MIRROR,
                                   "image_dir": str(tmp_path / "images")})  # fmt: skip
    result = snakemake(work)
    assert result.returncode == 0, result.stdout
    log = f"{RUN}/logs/build_container_hpcmem-cpu.log"
    line = re.search(r"^hpcmem: container.enabled=auto: hpcmem-cpu runs natively: building "
                     r"hpcmem-cpu-\w+\.sif from \S+ failed: (.*); build log: (\S+)$",
                     result.stdout, re.MULTILINE)  # fmt: skip
    assert line and line[2] == log and "FATAL" in line[1], result.stdout
    assert "hpcmem: hpcmem-cpu ran natively: building hpcmem-cpu-" in result.stdout
    assert {r["container"] for r in records(work, "collectives")} == {None}
    assert ImageRef.read(work / RUN / "build" / "images" / "hpcmem-cpu.json").image is None
    assert not list((tmp_path / "images").glob("*.sif"))


def test_true_stops_the_run_naming_the_build_log(apptainer: str, tmp_path: Path) -> None:
    work = workdir_with(tmp_path, **copy.deepcopy(SWEEP),
                        container={"enabled": True, "mirror": NO_MIRROR,
                                   "image_dir": str(tmp_path / "images")})  # fmt: skip
    result = snakemake(work)
    assert result.returncode == 1, result.stdout
    assert re.search(r"^hpcmem: container.enabled=true: building hpcmem-cpu-\w+\.sif from \S+ "
                     rf"failed: .*; build log: {RUN}/logs/build_container_hpcmem-cpu.log$",
                     result.stdout, re.MULTILINE), result.stdout  # fmt: skip
    assert "Error in rule build_container" in result.stdout
    assert not (work / RUN / "collectives").exists()
    assert not (work / RUN / "build" / "images" / "hpcmem-cpu.json").exists()
    assert not list((tmp_path / "images").glob("*.sif"))


@pytest.mark.slurm
def test_slurm_runs_collectives_in_the_image_with_srun_pmix(
    cpu_image: BuiltImage, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    sweep = copy.deepcopy(SWEEP)  # one point: HBW buffers, each rank on its own core
    sweep["collectives"].update(buffers=["hbw"], bindings=["cores"])
    image = cpu_image.ref
    sweep["container"] = image_settings(cpu_image.wheelhouse, compare_native=False)
    work = workdir_with(tmp_path / "work")
    profile = site_profile(tmp_path / "profile", slurm_cluster, sweep,
                           **{"set-resources__run_collectives__mpi": "srun --mpi=pmix"})
    # the wheel and the run's environment beforehand on the local profile, and on Slurm the
    # image job and the point alone (each Slurm job waits on the executor's status polls;
    # the build, aggregate and report jobs on Slurm are test_slurm_workflow.py's)
    sweep_file = ("--configfile", str(profile / "sweep.yaml"))
    built = snakemake(work, *sweep_file, "--until", "install_wheel")
    assert built.returncode == 0, built.stdout
    result = snakemake(work, "--until", "run_collectives", profile=profile,
                       env=slurm_cluster.env())
    assert result.returncode == 0, result.stdout
    assert "rule build_wheel" not in result.stdout and "rule build_container" in result.stdout
    assert f"srun --mpi=pmix -n 2 {image.runtime} exec --bind {work}" in result.stdout
    found = records(work, "collectives", "allreduce", "hbw", "ranks=2")
    assert sorted(r["size_bytes"] for r in found) == SIZES
    assert {r["container"]["digest"] for r in found} == {image.digest}
    assert {r["container"]["runtime_version"] for r in found} == {image.runtime_version}
    assert {r["mpi_library"] for r in found} == {image.libraries["mpi"]}  # PMIx 5 under 4.2
    (job_id,) = {r["slurm_job_id"] for r in found}
    steps = slurm_cluster.run("sacct", "-n", "-P", "-j", job_id, "-o", "JobID,NTasks,State")
    assert [f"{job_id}.0", "2", "COMPLETED"] in [
        line.split("|") for line in steps.stdout.splitlines()], steps.stdout  # fmt: skip
    ranks = found[0]["binding"]["per_rank"]  # numactl in the image, measured in each rank
    assert sorted(r["cpus"] for r in ranks) == [[0], [1]]
    assert all(r["placement"]["emulated"] and r["placement"]["hbw_fraction"] == 1.0
               for r in found)  # fmt: skip
    assert "rule run_collectives_native" not in result.stdout
