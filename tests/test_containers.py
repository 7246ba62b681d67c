"""Container images: definition files, container.enabled, cache keys, real Apptainer builds.

The definitions are parsed as the workflow parses them and, where a runtime is installed,
checked against Apptainer itself; builds that must fail (an unreachable mirror, a registry
that cannot exist) fail for real, and the CPU image is built for real once per session
(tests/container_image.py). Tests that need the runtime are skipped without one, saying why.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from container_image import NO_MIRROR, host_open_mpi, leftovers

from hpcmem.collectives.container_report import overhead_table
from hpcmem.results.aggregate import aggregate
from hpcmem.results.native_comparison import container_section
from hpcmem.results.summary import read_summary
from hpcmem.workflow.containers import (
    DEFAULT_DEBIAN,
    DEFAULT_GPU_BASE,
    DEFAULT_MIRROR,
    RELEASES,
    WHEELHOUSE_MOUNT,
    ContainerError,
    ImageRef,
    cache_key,
    host_arch,
    image_arch,
    obtain_image,
    parse_definition,
    resolve_container,
    runtime_version,
    sif_problem,
)
from hpcmem.workflow.containers.registry import unreachable_base

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
#: a registry name that can never resolve
NO_REGISTRY = "registry.invalid/hpcmem/none:1"


#: the source tree both images copy in and build hpcmem from
SOURCE_TREE = ["pyproject.toml", "requirements.txt", "README.md", "native", "hpcmem"]


def stage_headers(definition) -> list[str]:
    """The header of each stage of a multi-stage definition."""
    return re.findall(r"^Bootstrap:.*?(?=^%)", definition.text, re.MULTILINE | re.DOTALL)


def test_cpu_definition_builds_hpcmem_in_a_build_stage_and_runs_it_in_a_run_stage() -> None:
    definition = parse_definition(REPO / "containers" / "hpcmem-cpu.def")
    build, run = stage_headers(definition)
    for header in (build, run):
        assert re.search(r"^Bootstrap: debootstrap\nOSVersion: \{\{ DEBIAN \}\}\n"
                         r"MirrorURL: \{\{ MIRROR \}\}$", header, re.MULTILINE)  # fmt: skip
    assert "Stage: build" in build and "Stage: run" in run
    post_build, post_run = definition.scripts("post", {})
    for package in ("build-essential", "cmake", "python3-dev", "libmemkind-dev",
                    "libnuma-dev", "libopenmpi-dev"):  # fmt: skip
        assert package in post_build and package not in run + post_run
    include = re.search(r"^Include: (.*)$", run, re.MULTILINE)[1].split()
    assert {"python3", "openmpi-bin", "numactl", "hwloc"} <= set(include)
    assert "libnuma1" in include  # what _hbw loads (libumf.so and its libhwloc are pip's)
    assert not {"gcc", "g++", "build-essential", "cmake"} & set(include)
    assert "--no-build-isolation --no-deps /opt/hpcmem/src" in post_build  # built in the image
    assert "%files from build\n    /opt/venv /opt/venv" in definition.text
    assert definition.arguments["MIRROR"] == DEFAULT_MIRROR
    assert definition.arguments["DEBIAN"] == DEFAULT_DEBIAN == "bookworm"
    container = SCHEMA["properties"]["container"]["properties"]
    assert container["mirror"]["default"] == DEFAULT_MIRROR
    assert container["debian"]["default"] == DEFAULT_DEBIAN
    assert container["debian"]["enum"] == list(RELEASES)
    assert definition.files_sources({}) == [*SOURCE_TREE[:2], "containers/cpu-packages.txt",
                                            *SOURCE_TREE[2:]]  # fmt: skip
    # pip reads the wheelhouse alone when one is bound, else the index
    assert f"if ls {WHEELHOUSE_MOUNT}/*.whl >/dev/null 2>&1; then\n        set -- --no-index " \
           f"--find-links {WHEELHOUSE_MOUNT}" in post_build  # fmt: skip
    makefile_mpi4py = re.search(r"mpi4py==[\d.]+", (REPO / "Makefile").read_text())[0]
    packages = (REPO / "containers" / "cpu-packages.txt").read_text()
    assert re.findall(r"^mpi4py==[\d.]+", packages, re.MULTILINE) == [makefile_mpi4py]
    assert re.search(r"^umf$", packages, re.MULTILINE)  # hpcmem._hbw's default backend


def test_gpu_definition_builds_torch_and_the_um_library_on_a_cuda_base() -> None:
    definition = parse_definition(REPO / "containers" / "hpcmem.def")
    assert re.search(r"^Bootstrap: docker\nFrom: \{\{ BASE \}\}$", definition.text, re.MULTILINE)
    assert definition.arguments["BASE"] == DEFAULT_GPU_BASE
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-devel-ubuntu\d\d\.04", DEFAULT_GPU_BASE)
    assert SCHEMA["properties"]["container"]["properties"]["gpu_base"]["default"] == (
        DEFAULT_GPU_BASE
    )
    assert definition.arguments["OMPI_VERSION"] == host_open_mpi()
    (post,) = definition.scripts("post", {})
    assert "--with-pmix=" in post and "--with-cuda=/usr/local/cuda" in post
    makefile_mpi4py = re.search(r"mpi4py==[\d.]+", (REPO / "Makefile").read_text())[0]
    assert f"--no-binary mpi4py {makefile_mpi4py}" in post
    assert "-r /opt/hpcmem/src/requirements.txt" in post  # torch at its pin
    assert re.search(r"^torch==", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert "import torch, hpcmem._hbw, hpcmem._um" in definition.text  # the UM library built
    assert definition.files_sources({}) == SOURCE_TREE
    assert all((REPO / path).exists() for path in SOURCE_TREE)  # relative to the repository


@pytest.mark.parametrize(("name", "values"), [
    ("hpcmem-cpu.def", {"DEBIAN": "bookworm"}), ("hpcmem-cpu.def", {"DEBIAN": "trixie"}),
    ("hpcmem.def", {"BASE": DEFAULT_GPU_BASE}),
    ("hpcmem.def", {"BASE": "nvcr.io/nvidia/cuda:12.8.1-devel-ubuntu24.04",
                    "OMPI_VERSION": "5.0.7"}),
])  # fmt: skip
def test_definitions_render_to_valid_shell(name: str, values: dict, tmp_path: Path) -> None:
    definition = parse_definition(REPO / "containers" / name)
    definition.check_arguments(values)
    rendered = definition.render(values)
    assert "{{" not in rendered and all(value in rendered for value in values.values())
    for number, script in enumerate(definition.scripts("post", values)):
        path = tmp_path / f"post{number}.sh"
        path.write_text(script)
        checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, (name, number, checked.stderr)


@pytest.mark.parametrize("value", ["x\nBootstrap: scratch", "a b", "", "tab\there"])
def test_a_build_argument_that_would_break_the_definition_is_refused(value: str) -> None:
    definition = parse_definition(REPO / "containers" / "hpcmem.def")
    with pytest.raises(ContainerError, match=r"build argument BASE=.* is not one word"):
        definition.check_arguments({"BASE": value})


#: (definition text, what the error says after FILE:LINE)
BAD_DEFINITIONS = [
    ("From: debian:12\n%post\n    true\n", ":2: no 'Bootstrap: AGENT' header before it"),
    ("Bootstrap: debootstrap\nOSVersion: bookworm\n%psot\n    true\n",
     ":3: unknown section %psot (one of %appenv"),
    ("Bootstrap: nosuch\nFrom: x\n%post\n    true\n", ":1: Bootstrap 'nosuch' is not an agent"),
    ("Bootstrap: docker\nFrom x\n", ":2: 'From x' is not a 'KEY: VALUE' header line"),
    ("# nothing but a comment\n", ": no 'Bootstrap: AGENT' header"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_DEFINITIONS)
def test_a_definition_apptainer_would_refuse_is_refused_naming_file_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.def"
    path.write_text(text)
    with pytest.raises(ContainerError) as error:
        parse_definition(path)
    assert str(error.value).startswith(f"{path}{message}")


def test_a_variable_without_a_value_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "args.def"
    path.write_text("Bootstrap: localimage\nFrom: {{ BASE_IMAGE }}\n")
    with pytest.raises(ContainerError, match=r"\{\{ BASE_IMAGE \}\} has no value"):
        parse_definition(path).check_arguments({})
    parse_definition(path).check_arguments({"BASE_IMAGE": "base.sif"})


def test_apptainer_refuses_what_the_parser_refuses(apptainer: str, tmp_path: Path) -> None:
    for number, (text, _) in enumerate(BAD_DEFINITIONS):
        path = tmp_path / f"bad{number}.def"
        path.write_text(text)
        command = [apptainer, "build", "--fakeroot", str(tmp_path / "x.sif"), str(path)]
        build = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert build.returncode != 0 and "FATAL" in build.stderr, (text, build.stderr)
    assert not (tmp_path / "x.sif").exists()


def test_auto_without_a_runtime_runs_natively(tmp_path: Path) -> None:
    plan = resolve_container({"container": {"enabled": "auto"}}, path=str(tmp_path))
    assert not plan.enabled and plan.runtime is None
    assert plan.reason == "container.enabled=auto: no apptainer or singularity on PATH, " \
                          "running natively"  # fmt: skip
    native = ImageRef(name="hpcmem-cpu", gpu=False, image=None, reason="no image")
    assert plan.exec_command(["hpcmem", "info"], native, launcher=["srun", "-n", "2"]) == [
        "srun", "-n", "2", "hpcmem", "info"
    ]  # fmt: skip


@pytest.mark.parametrize("value", [True, "true"])
def test_true_without_a_runtime_fails_before_any_job(tmp_path: Path, value) -> None:
    with pytest.raises(ContainerError) as error:
        resolve_container({"container": {"enabled": value}}, path=str(tmp_path))
    assert str(error.value).startswith(
        "container.enabled is true but neither apptainer nor singularity is on PATH"
    )


@pytest.mark.parametrize("value", [False, "false"])
def test_false_is_native_even_with_a_runtime(apptainer: str, value) -> None:
    plan = resolve_container({"container": {"enabled": value}})
    assert not plan.enabled and plan.reason == "container.enabled=false: running natively"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_enabled_value_names_the_key(value) -> None:
    with pytest.raises(ContainerError, match=r"container.enabled: .* is not one of auto, true"):
        resolve_container({"container": {"enabled": value}}, path="")


def test_bad_definition_or_prebuilt_image_stops_at_resolution(apptainer: str, tmp_path: Path):
    bad = tmp_path / "bad.def"
    bad.write_text(BAD_DEFINITIONS[1][0])
    config = {"container": {"enabled": "auto", "cpu_definition": str(bad)}}
    with pytest.raises(ContainerError, match=rf"^container.cpu_definition: {bad}:3: unknown"):
        resolve_container(config, source_dir=REPO)
    missing = tmp_path / "missing.sif"
    with pytest.raises(ContainerError, match=rf"^container.gpu_image: {missing}: no such image"):
        resolve_container({"container": {"gpu_image": str(missing)}}, source_dir=REPO)
    broken = {"container": {"gpu_base": "cuda:12 x"}}  # a value the schema would refuse too
    with pytest.raises(ContainerError, match=r"^container.gpu_definition: .*build argument BASE"):
        resolve_container(broken, source_dir=REPO)
    for key, value, message in [("wheelhouse", tmp_path / "none", "no such folder"),
                                ("wheelhouse", tmp_path, "holds no wheel"),
                                ("pip_index", f"file://{tmp_path}/none", "no such folder")]:
        with pytest.raises(ContainerError, match=rf"^container.{key}: .*{message}"):
            resolve_container({"container": {key: str(value)}}, source_dir=REPO)


@pytest.mark.parametrize(("content", "found"), [
    (b"not an image\n", "b''"),
    (b"#!/usr/bin/env run-singularity\n\0" + b"NOT_MAGIC\0" + b"\0" * 100, "b'NOT_MAGIC\\x00'"),
], ids=["text", "other-header"])  # fmt: skip
@pytest.mark.parametrize("enabled", ["auto", True])
def test_a_prebuilt_image_that_is_not_a_sif_is_refused_without_a_runtime(
    tmp_path: Path, content: bytes, found: str, enabled: object
) -> None:
    image = tmp_path / "hpcmem.sif"
    image.write_bytes(content)
    with pytest.raises(ContainerError) as error:
        resolve_container({"container": {"enabled": enabled, "gpu_image": str(image)}},
                          source_dir=REPO, path=str(tmp_path))  # no runtime on this PATH
    assert str(error.value) == (
        f"container.gpu_image: {image} is not a SIF image (its bytes 32 to 41 are {found}, "
        "where every SIF file holds b'SIF_MAGIC\\x00'): give one made by `apptainer build` "
        "or `singularity build`, or null to build one from container.gpu_definition")


def test_a_definition_that_would_be_read_for_ever_is_refused() -> None:
    with pytest.raises(ContainerError, match=r"^/dev/zero: not a regular file"):
        parse_definition("/dev/zero")


def test_a_sif_header_is_enough_without_a_runtime(tmp_path: Path) -> None:
    image = tmp_path / "hpcmem-cpu.sif"
    image.write_bytes(b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + b"01\0")
    assert sif_problem(image) is None
    plan = resolve_container({"container": {"cpu_image": str(image)}}, source_dir=REPO,
                             path=str(tmp_path))
    assert not plan.enabled and plan.cpu.prebuilt == image


def foreign_image(apptainer: str, folder: Path) -> Path:
    """A real SIF whose root file system is marked arm64 (made with `apptainer sif`)."""
    root, squashfs, image = folder / "root", folder / "root.sqfs", folder / "arm64.sif"
    (root / "bin").mkdir(parents=True)
    subprocess.run(["mksquashfs", str(root), str(squashfs), "-quiet", "-noappend"], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([apptainer, "sif", "new", str(image)], check=True)
    subprocess.run([apptainer, "sif", "add", str(image), str(squashfs), "--datatype", "4",
                    "--parttype", "2", "--partfs", "1", "--partarch", "4"], check=True)  # fmt: skip
    return image


def test_an_image_for_another_architecture_is_refused(apptainer: str, tmp_path: Path) -> None:
    if host_arch() != "amd64":
        pytest.skip("the foreign image is marked arm64: on this host it is not foreign")
    image = foreign_image(apptainer, tmp_path)
    assert image_arch(apptainer, image) == "arm64"
    config = {"container": {"enabled": True, "cpu_image": str(image)}}
    with pytest.raises(ContainerError) as error:
        resolve_container(config, source_dir=REPO)
    assert str(error.value) == (
        f"container.cpu_image: {image} is built for arm64, this host runs amd64: use an image "
        "built on amd64, or null to build one here"
    )


def wheel(path: Path, members: dict[str, bytes], year: int) -> Path:
    """A wheel (zip) holding ``members``, every entry dated ``year``."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, (year, 1, 1, 0, 0, 0)), data)
    return path


def source_copy(folder: Path) -> Path:
    """A copy of what the CPU definition's %files take from the repository."""
    for source in parse_definition(REPO / "containers" / "hpcmem-cpu.def").files_sources({}):
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, folder / source, ignore=shutil.ignore_patterns(
                "__pycache__"))  # fmt: skip
        else:
            (folder / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / source, folder / source)
    return folder


def test_cache_key_follows_definition_arguments_sources_and_wheelhouse(tmp_path: Path) -> None:
    definition = parse_definition(REPO / "containers" / "hpcmem-cpu.def")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    members = {"numpy/__init__.py": b"x = 1\n", "numpy-2.0.dist-info/RECORD": b"r\n"}
    wheel(wheels / "numpy-2.0-py3-none-any.whl", members, 2020)
    args, binds = {"MIRROR": DEFAULT_MIRROR}, [f"{wheels}:{WHEELHOUSE_MOUNT}:ro"]
    key = cache_key(definition, args, REPO, binds)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert cache_key(definition, args, REPO) != key  # no wheelhouse: another image

    context = source_copy(tmp_path / "src")
    assert cache_key(definition, args, context, binds) == key  # the same sources elsewhere
    (context / "native" / "hbw" / "module.cpp").write_text("// changed\n")
    assert cache_key(definition, args, context, binds) != key

    wheel(wheels / "numpy-2.0-py3-none-any.whl", members, 2024)  # rebuilt, same content
    assert cache_key(definition, args, REPO, binds) == key
    copy = shutil.copytree(wheels, tmp_path / "copy")  # the same wheels in another folder
    assert cache_key(definition, args, REPO, [f"{copy}:{WHEELHOUSE_MOUNT}:ro"]) == key
    wheel(wheels / "numpy-2.0-py3-none-any.whl", {**members, "numpy/new.py": b""}, 2024)
    changed = cache_key(definition, args, REPO, binds)
    assert changed != key
    assert cache_key(definition, {**args, "MIRROR": "http://mirror/debian"}, REPO,
                     binds) != changed  # fmt: skip
    assert cache_key(definition, {**args, "DEBIAN": "trixie"}, REPO, binds) != changed
    other = tmp_path / "other.def"
    other.write_text(definition.text + "\n%labels\n    changed yes\n")
    assert cache_key(parse_definition(other), args, REPO, binds) != changed
    with pytest.raises(ContainerError, match="bound folder /nowhere does not exist"):
        cache_key(definition, args, REPO, [f"/nowhere:{WHEELHOUSE_MOUNT}:ro"])
    with pytest.raises(ContainerError, match=r"%files source pyproject\.toml does not exist"):
        cache_key(definition, args, tmp_path / "wheels", binds)


def test_exec_command_runs_each_rank_in_the_image_with_its_provenance(tmp_path: Path) -> None:
    plan = resolve_container({"container": {"enabled": "auto"}}, path=str(tmp_path),
                             binds=["/work", "/scratch"])  # fmt: skip
    image = ImageRef(name="hpcmem-cpu", gpu=False, image="/images/cpu.sif", digest="sha256:ab",
                     runtime="/usr/bin/apptainer", runtime_version="1.4.5")  # fmt: skip
    command = plan.exec_command(["hpcmem", "collectives"], image, launcher=["srun", "-n", "2"])
    assert command == [
        "srun", "-n", "2", "/usr/bin/apptainer", "exec", "--bind", "/work", "--bind", "/scratch",
        "--env", "HPCMEM_CONTAINER_IMAGE=/images/cpu.sif",
        "--env", "HPCMEM_CONTAINER_DIGEST=sha256:ab",
        "--env", "HPCMEM_CONTAINER_RUNTIME=apptainer",
        "--env", "HPCMEM_CONTAINER_RUNTIME_VERSION=1.4.5",
        "/images/cpu.sif", "hpcmem", "collectives",
    ]  # fmt: skip
    gpu = ImageRef(name="hpcmem", gpu=True, image="/images/gpu.sif", runtime="apptainer")
    assert plan.exec_command(["hpcmem", "train"], gpu)[:3] == ["apptainer", "exec", "--nv"]


def test_records_say_which_image_and_runtime_they_ran_in() -> None:
    code = "import json, hpcmem.node.probe as p; print(json.dumps(p.current_container()))"
    env = {"HPCMEM_CONTAINER_IMAGE": "/images/cpu.sif", "HPCMEM_CONTAINER_DIGEST": "sha256:ab",
           "HPCMEM_CONTAINER_RUNTIME": "apptainer", "HPCMEM_CONTAINER_RUNTIME_VERSION": "1.4.5"}
    inside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)  # fmt: skip
    assert json.loads(inside.stdout) == {"image": "/images/cpu.sif", "digest": "sha256:ab",
                                         "runtime": "apptainer", "runtime_version": "1.4.5"}
    native = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={}, check=True)  # fmt: skip
    assert native.stdout.strip() == "null"


def test_an_unreachable_mirror_fails_the_build_naming_its_log(apptainer: str, tmp_path: Path):
    definition = parse_definition(REPO / "containers" / "hpcmem-cpu.def")
    log_path = tmp_path / "build.log"
    images = tmp_path / "images"
    args = {"MIRROR": NO_MIRROR}
    with open(log_path, "w") as log, pytest.raises(ContainerError) as error:
        obtain_image("hpcmem-cpu", definition, args, image_dir=images, runtime=apptainer,
                     runtime_version=runtime_version(apptainer), context=REPO, log=log,
                     log_path=str(log_path))  # fmt: skip
    message = str(error.value)
    assert message.startswith("building hpcmem-cpu-")
    assert f"from {definition.path} failed: " in message
    assert message.endswith(f"; build log: {log_path}")
    assert "FATAL" in message and f"--build-arg MIRROR={NO_MIRROR}" in log_path.read_text()
    assert leftovers(images) == []  # no image, no partial file, no stamp


def test_a_base_image_whose_registry_does_not_answer_is_not_built(apptainer: str, tmp_path):
    definition = parse_definition(REPO / "containers" / "hpcmem.def")
    log_path = tmp_path / "build.log"
    with open(log_path, "w") as log, pytest.raises(ContainerError) as error:
        obtain_image("hpcmem", definition, {"BASE": NO_REGISTRY}, image_dir=tmp_path / "images",
                     runtime=apptainer, runtime_version="1.4.5", context=REPO, log=log,
                     log_path=str(log_path), gpu=True)  # fmt: skip
    assert str(error.value).startswith(
        f"hpcmem is not built: its base image docker://{NO_REGISTRY} cannot be pulled from this "
        "host: registry.invalid:443 did not answer (")
    assert log_path.read_text() == ""  # refused before Apptainer started
    assert leftovers(tmp_path / "images") == []


def test_the_registry_or_the_proxy_must_answer() -> None:
    definition = parse_definition(REPO / "containers" / "hpcmem.def")
    with socket.create_server(("127.0.0.1", 0)) as server:  # a registry that answers
        port = server.getsockname()[1]
        assert unreachable_base(definition, {"BASE": f"127.0.0.1:{port}/cuda:1"},
                                environ={}) is None
        assert unreachable_base(definition, {"BASE": NO_REGISTRY},  # the proxy pulls it
                                environ={"https_proxy": f"http://127.0.0.1:{port}"}) is None
    # the same port, closed now: the proxy is named
    why = unreachable_base(definition, {"BASE": "nvidia/cuda:1"},
                           environ={"HTTPS_PROXY": f"127.0.0.1:{port}"})
    assert why == ("its base image docker://nvidia/cuda:1 cannot be pulled from this host: "
                   f"registry-1.docker.io:443 through the proxy 127.0.0.1:{port} did not "
                   "answer (Connection refused)")
    cpu = parse_definition(REPO / "containers" / "hpcmem-cpu.def")  # debootstrap: no registry
    assert unreachable_base(cpu, {"MIRROR": NO_MIRROR}, environ={}) is None


def test_overhead_is_the_container_latency_over_the_native_one(tmp_path: Path) -> None:
    # two real runs of the same points, one standing for the image and one for native
    real = REPO / "tests" / "fixtures" / "records" / "real"
    image = aggregate([real / "collectives-run-a.jsonl"], tmp_path / "a").summary
    native = aggregate([real / "collectives-run-b.jsonl"], tmp_path / "b").summary
    table = overhead_table(image[image["benchmark"] == "collectives"],
                           native[native["benchmark"] == "collectives"])
    assert len(table) == len(image) == len(native)
    keys = ["op", "dtype", "ranks", "binding", "buffer", "size_bytes"]
    row = table.iloc[0]

    def latency(frame):  # of the point in row
        return frame[(frame[keys] == [row[k] for k in keys]).all(axis=1)]["latency_us.avg"].item()

    assert row["overhead"] == pytest.approx(latency(image) / latency(native))
    assert row["container_us"] / row["native_us"] == pytest.approx(row["overhead"])
    # records made natively: the section says there is nothing to compare
    html = container_section(read_summary(tmp_path / "a"), read_summary(tmp_path / "b"))
    assert "The sweep ran natively" in html and "<table>" not in html


def test_a_build_says_each_stage_and_where_it_stays_while_its_output_goes_to_the_log(
        tmp_path: Path) -> None:
    from hpcmem.workflow.containers.progress import run_logged

    script = ("echo 'INFO:    Starting build...'; echo 'Get:1 http://deb.debian.org'; "
              "sleep 0.5; echo 'INFO:    Creating SIF file...'; exit 3")
    said = io.StringIO()
    with (tmp_path / "build.log").open("w") as log:
        status = run_logged(["sh", "-c", script], log, "building cpu.sif", stream=said,
                            quiet_seconds=0.2)
    assert status == 3
    assert (tmp_path / "build.log").read_text().splitlines() == [
        "INFO:    Starting build...", "Get:1 http://deb.debian.org",
        "INFO:    Creating SIF file..."]
    lines = said.getvalue().splitlines()
    assert re.fullmatch(r"hpcmem: building cpu\.sif: Starting build\.\.\. \(0 s\)", lines[0])
    assert any(re.fullmatch(r"hpcmem: building cpu\.sif: still Starting build\.\.\. \(\d+ s\)",
                            line) for line in lines[1:-1]), lines
    assert re.fullmatch(r"hpcmem: building cpu\.sif: Creating SIF file\.\.\. \(\d+ s\)",
                        lines[-1])


@pytest.mark.parametrize(("train", "executor", "driver", "why"), [
    ({"models": []}, "local", True, "no training points in the sweep"),
    ({"models": ["transformer"], "enabled": False}, "local", True,
     "no training points in the sweep"),
    ({"models": ["transformer"], "device": "cpu"}, "slurm", True, "train.device is cpu"),
    ({"models": ["transformer"]}, "local", False, "no NVIDIA driver on this machine"),
    ({"models": ["transformer"]}, None, False, "no NVIDIA driver on this machine"),
    ({"models": ["transformer"]}, "local", True, None),
    ({"models": ["transformer"]}, "slurm", False, None),  # the GPUs are other nodes'
])
def test_the_gpu_image_is_built_only_where_a_training_point_can_run_in_it(
        train: dict, executor: str | None, driver: bool, why: str | None,
        tmp_path: Path) -> None:
    from hpcmem.workflow.containers import gpu_image_unneeded

    loaded = tmp_path / "nvidia"
    if driver:
        loaded.mkdir()
    said = gpu_image_unneeded(train, executor, driver=loaded)
    assert said == why if why is None else said.startswith(why)
