"""`hpcmem info` and the node probes behind it: the real console script, text and JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata

from hpcmem.node import topology
from hpcmem.node.idlist import format_id_list


def _info(hpcmem_exe: str, *args: str, env: dict[str, str] | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMKIND_")}
    started = time.monotonic()
    done = subprocess.run(
        [hpcmem_exe, "info", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
    )
    return done, time.monotonic() - started


def test_info_text(hpcmem_exe: str) -> None:
    done, seconds = _info(hpcmem_exe)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("hpcmem ") and lines[1] == "NUMA nodes:"
    for node in topology.numa_nodes():
        cpus = format_id_list(node.cpus)
        assert re.search(rf"^  node {node.id}: CPUs {cpus}, \d+\.\d GiB ", done.stdout, re.M)
    assert re.search(r"^HBW backend: (umf|memkind) \d+\.\d+\.\d+$", done.stdout, re.M)
    assert re.search(r"^MPI: Open MPI v\d", done.stdout, re.M)
    assert re.search(r"^Slurm: ", done.stdout, re.M)
    assert re.search(r"^Container runtime: ", done.stdout, re.M)
    assert seconds < 10


def test_info_json(hpcmem_exe: str) -> None:
    done, _ = _info(hpcmem_exe, "--json", env={"MEMKIND_HBW_NODES": "0"})
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    nodes = topology.numa_nodes()
    assert [n["id"] for n in info["numa_nodes"]] == [n.id for n in nodes]
    assert [tuple(n["cpus"]) for n in info["numa_nodes"]] == [n.cpus for n in nodes]
    assert info["numa_nodes"][0]["memory_total_bytes"] == nodes[0].memory_total
    assert info["hbw"] == {"nodes": [0], "source": "MEMKIND_HBW_NODES", "emulated": True}
    assert info["mpi"]["mpi4py"] == metadata.version("mpi4py")
    assert info["mpi"]["library"].startswith("Open MPI v") and "\0" not in info["mpi"]["library"]
    assert info["slurm"]["job_id"] == os.environ.get("SLURM_JOB_ID")
    assert info["gpus"] == [] or all(g["memory_total_bytes"] > 0 for g in info["gpus"])


def test_parse_nvidia_smi() -> None:
    from hpcmem.node.probe import parse_nvidia_smi

    text = "0, NVIDIA H200, 143771, 570.86.15\n1, Tesla V100-SXM2-16GB, [N/A], 535.1\n"
    assert parse_nvidia_smi(text) == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "memory_total_bytes": 143771 << 20,
            "driver": "570.86.15",
        },
        {"index": 1, "name": "Tesla V100-SXM2-16GB", "memory_total_bytes": None, "driver": "535.1"},
    ]


def test_info_without_hbw_declared(hpcmem_exe: str) -> None:
    done, _ = _info(hpcmem_exe)
    expected = topology.hbw_nodes({})
    if expected.nodes:
        assert f"detected by {expected.source}" in done.stdout
    else:
        assert "HBW nodes: none (" in done.stdout


def test_info_reports_bad_hbw_variable(hpcmem_exe: str) -> None:
    done, _ = _info(hpcmem_exe, "--json", env={"MEMKIND_HBW_NODES": "0-x"})
    assert done.returncode == 0, done.stderr
    error = json.loads(done.stdout)["hbw"]["error"]
    assert error.startswith("MEMKIND_HBW_NODES='0-x': '0-x' is not a node or a range")


def test_info_with_nothing_on_path(hpcmem_exe: str, tmp_path) -> None:
    """No sinfo, nvidia-smi or apptainer on PATH: reported as absent, exit 0."""
    done, _ = _info(hpcmem_exe, env={"PATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Slurm: not installed (no sinfo on PATH)" in done.stdout
    assert "Container runtime: none (no apptainer or singularity on PATH)" in done.stdout


def test_info_without_native_module() -> None:
    """A build without a backend: info still works and says how to get one."""
    code = (
        "import sys; sys.modules['hpcmem._hbw'] = None\n"
        "from hpcmem.cli import main\n"
        "sys.exit(main(['info']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "HBW backend: not available: hpcmem._hbw cannot be loaded" in done.stdout
    assert "pip install umf" in done.stdout and "apt-get install libmemkind-dev" in done.stdout


def test_current_container_named_by_the_workflow_or_the_runtime(monkeypatch) -> None:
    from hpcmem.node.probe import current_container

    for name in ("HPCMEM_CONTAINER_IMAGE", "HPCMEM_CONTAINER_DIGEST", "HPCMEM_CONTAINER_RUNTIME",
                 "HPCMEM_CONTAINER_RUNTIME_VERSION", "APPTAINER_CONTAINER",
                 "SINGULARITY_CONTAINER"):
        monkeypatch.delenv(name, raising=False)
    assert current_container() is None
    monkeypatch.setenv("APPTAINER_CONTAINER", "/images/own.sif")
    assert current_container() == {"image": "/images/own.sif", "digest": ""}
    monkeypatch.setenv("HPCMEM_CONTAINER_IMAGE", "/images/cpu.sif")
    monkeypatch.setenv("HPCMEM_CONTAINER_DIGEST", "sha256:ab")
    monkeypatch.setenv("HPCMEM_CONTAINER_RUNTIME", "apptainer")
    monkeypatch.setenv("HPCMEM_CONTAINER_RUNTIME_VERSION", "1.4.5")
    assert current_container() == {"image": "/images/cpu.sif", "digest": "sha256:ab",
                                   "runtime": "apptainer", "runtime_version": "1.4.5"}


def test_info_text_names_the_slow_tier_and_hmat_figures() -> None:
    """A CXL-like node: its HMAT figures on its line, and the DAX KMEM tier named with how
    it was found."""
    from hpcmem.cli.info import render
    from hpcmem.node.probe import collect

    info = collect()
    info["numa_nodes"] = [
        {"id": 0, "cpus": [0, 1], "memory_total_bytes": 1 << 30, "memory_free_bytes": 1 << 29,
         "memory_only": False, "read_bandwidth_MBps": 100000, "read_latency_ns": 100},
        {"id": 1, "cpus": [], "memory_total_bytes": 1 << 29, "memory_free_bytes": 1 << 29,
         "memory_only": True, "read_bandwidth_MBps": 30000, "read_latency_ns": 250},
    ]
    info["dax_kmem"] = {"nodes": [1], "source": "hmat"}
    text = render(info)
    assert "  node 0: CPUs 0-1, 1.0 GiB (0.5 GiB free), HMAT 100 GB/s 100 ns\n" in text
    assert "  node 1: no CPUs (memory only), 0.5 GiB (0.5 GiB free), HMAT 30 GB/s 250 ns\n" in text
    assert ("DAX KMEM nodes: 1 (detected by hmat: slower than every CPU node's memory, as CXL)"
            in text)
    info["dax_kmem"] = {"nodes": [1], "source": "HPCMEM_DAX_KMEM_NODES"}
    assert "DAX KMEM nodes: 1 (declared by HPCMEM_DAX_KMEM_NODES)" in render(info)
