"""Real HBM topologies: QEMU guests whose firmware (SRAT, SLIT, ACPI HMAT) describes them.

One boot per topology (tools/vm/boot.py) runs tools/vm/guest/checks.py, which does every
check inside and writes one JSON file; the tests here assert on it. No HBW variable is set
in the guest: the HBM nodes must come from the platform. The boot image is built once and
cached (tools/vm/build-image.sh, about 3 minutes the first time); each topology then takes
about a minute under TCG. Skipped, saying why, where QEMU cannot run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpcmem.results.schema import validate_record

REPO = Path(__file__).resolve().parents[1]
BOOT = REPO / "tools" / "vm" / "boot.py"
#: per topology: its HBW nodes, and the HBM node local to each CPU node
EXPECTED = {
    "knl-flat": {"hbw": [1], "local": {0: 1}},
    "xeon-max-snc2": {"hbw": [2, 3], "local": {0: 2, 1: 3}},
}
#: what boots the VMs and builds their image (Debian qemu-system-x86, debootstrap,
#: busybox-static, cpio, kmod)
TOOLS = ("qemu-system-x86_64", "debootstrap", "busybox", "cpio", "depmod")
GUEST_SECONDS = 400  # one topology's boot and checks, with room for a loaded host

pytestmark = pytest.mark.vm


def _unsupported() -> str | None:
    """Why QEMU test VMs cannot run here, or None."""
    if os.environ.get("HPCMEM_VM_TESTS") == "0":
        return "HPCMEM_VM_TESTS=0"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"the VM tests need an x86_64 Linux host, not {platform.machine()}"
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"  # debootstrap and depmod live there
    for tool in TOOLS:
        if shutil.which(tool, path=path) is None:
            return f"{tool} not installed (tools/system-packages.txt: run `make setup`)"
    if os.geteuid() != 0:
        return "building the VM image (debootstrap) needs root"
    return None


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def guest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, dict[str, Any]]:
    """The topology's name and what checks.py found inside it."""
    if reason := _unsupported():
        pytest.skip(reason)
    name = request.param
    out = tmp_path_factory.mktemp(name)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(BOOT), "--timeout", str(GUEST_SECONDS), name, str(out), "--",
         "python", "tools/vm/guest/checks.py", "/mnt/out/checks.json"],
        capture_output=True, text=True, timeout=GUEST_SECONDS + 300, check=False)
    log = out / "guest.log"
    assert done.returncode == 0, (done.stderr + (log.read_text()[-4000:] if log.exists() else ""))
    checks = json.loads((out / "checks.json").read_text())
    checks["host_seconds"] = round(time.monotonic() - started, 1)
    print(f"{name}: {checks['host_seconds']} s on the host, guest {checks['seconds']}")
    return name, checks


def _cpus(info: dict[str, Any], node: int) -> set[int]:
    return set(next(n["cpus"] for n in info["numa_nodes"] if n["id"] == node))


def test_info_names_the_hbm_nodes_without_any_override(guest) -> None:
    name, checks = guest
    info = checks["info"]
    assert info["hbw"] == {"nodes": EXPECTED[name]["hbw"], "source": "hmat", "emulated": False}
    assert info["hbw_backend"]["name"] == "umf"
    assert info["hbw_backend"]["highest_bandwidth"] == EXPECTED[name]["hbw"]  # UMF agrees
    memory_only = [n["id"] for n in info["numa_nodes"] if not n["cpus"]]
    assert memory_only == EXPECTED[name]["hbw"]


def test_every_kind_lands_on_the_nodes_it_should(guest) -> None:
    name, checks = guest
    hbw, local = EXPECTED[name]["hbw"], EXPECTED[name]["local"]
    assert {key.split("/")[0] for key in checks["kinds"]} >= {"umf"}
    for key, found in checks["kinds"].items():
        backend, cpu_node = key.split("/")
        node = int(cpu_node.removeprefix("cpu"))
        assert found["backend"]["name"] == backend
        assert set(found["cpus"]) <= _cpus(checks["info"], node)
        expected = {"dram": {node}, "hbw": {local[node]}, "hbw_preferred": {local[node]},
                    "hbw_interleave": set(hbw)}
        for kind, nodes in expected.items():
            record = found[kind]
            where = {int(n): count for n, count in record["nodes"].items()}
            assert set(where) == nodes, (key, kind, record)  # 100% of the pages there
            assert record["untouched"] == 0 and sum(where.values()) == record["pages"]
            assert record["emulated"] is False and record["source"] == "hmat"
            assert record["hbw_fraction"] == (0.0 if kind == "dram" else 1.0)
            assert found[kind]["verify"] is (kind != "dram")
        spread = [count / found["hbw_interleave"]["pages"]
                  for count in found["hbw_interleave"]["nodes"].values()]
        assert min(spread) > 0.4 if len(hbw) == 2 else spread == [1.0]


def test_a_four_rank_plan_puts_each_rank_on_its_cores_and_memory(guest) -> None:
    """``hpcmem bind hbw`` under ``mpirun -n 4``: each rank on a CPU node, round robin, its
    memory bound to that node's HBM, and the HBW points run there and validate."""
    name, checks = guest
    local = EXPECTED[name]["local"]
    cpu_nodes = sorted(local)
    plan = checks["plan"]
    ranks = sorted(plan["ranks"], key=lambda rank: rank["local_rank"])
    assert [rank["local_rank"] for rank in ranks] == [0, 1, 2, 3]
    for rank in ranks:
        cpu_node = cpu_nodes[rank["local_rank"] % len(cpu_nodes)]
        memory = local[cpu_node]
        assert rank["numactl"] == [f"--cpunodebind={cpu_node}", f"--membind={memory}"]
        assert set(rank["cpus"]) <= _cpus(checks["info"], cpu_node)
        assert rank["mempolicy"] == {"mode": "bind", "nodes": [memory]}
    assert plan["statuses"] == ["ok"] and plan["validated"]
    for kind, placement in plan["placement"].items():
        assert {int(node) for node in placement["nodes"]} == set(local.values()), kind
        assert placement["hbw_fraction"] == 1.0 and placement["emulated"] is False, kind
        assert placement["untouched"] == 0


def test_the_location_matrix_runs_and_validates(guest) -> None:
    """Buffers on every node x ranks on every CPU node: one run per memory node with a rank
    on each CPU node, every rank's memory bound to that node."""
    name, checks = guest
    info = checks["info"]
    cpu_nodes = sorted(EXPECTED[name]["local"])
    assert sorted(map(int, checks["matrix"])) == [n["id"] for n in info["numa_nodes"]]
    for key, cell in checks["matrix"].items():
        memory = int(key)
        assert cell["statuses"] == ["ok"] and cell["validated"], (key, cell)
        assert cell["nodes"] == [key], (key, cell)  # every page of every buffer there
        assert cell["rank_nodes"] == [[node] for node in cpu_nodes], (key, cell)
        assert cell["rank_mempolicies"] == [json.dumps({"mode": "bind", "nodes": [memory]})]
        assert cell["emulated"] == [False] and cell["vm_topology"] == [name]
        assert cell["hbw_sources"] == ["hmat"] and cell["hbw_backend"] == ["umf"]
    record = checks["record"]
    assert validate_record(record) == []
    assert record["vm_topology"]["name"] == name
    assert "not the hardware's" in record["vm_topology"]["note"]
