"""Real HBM and CXL topologies: QEMU guests whose firmware (SRAT, SLIT, ACPI HMAT) describes
them, one of them a compute node of a test Slurm cluster.

Every topology boots once, one after the other (tests/vm_guests.py), and runs
tools/vm/guest/checks.py, which does every check inside and writes one JSON file; the tests
here assert on it. No HBW variable is set in the guest: the HBM and CXL nodes must come from
the platform. The xeon-max-snc2 guest, booted last, is also the node of partition ``hbm`` of
a test cluster of its own: a job submitted from here runs its plan there, HBW collectives on
four ranks under the ``hbw`` binding, as a site would. The boot image is built once and
cached (tools/vm/build-image.sh, about 3 minutes the first time). Skipped, saying why, where
QEMU cannot run.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster
from vm_guests import (
    GUEST_SECONDS,
    SLURM_NODE,
    Fleet,
    Guest,
    guest_checks,
    slurm_unsupported,
    unsupported,
)

from hpcmem.cli import main
from hpcmem.results.schema import validate_record

#: per topology: its HBW nodes, its DAX KMEM (slow, CXL) nodes, and the HBM node local to
#: each CPU node
EXPECTED = {
    "knl-flat": {"hbw": [1], "dax_kmem": [], "local": {0: 1}},
    "xeon-max-snc2": {"hbw": [2, 3], "dax_kmem": [], "local": {0: 2, 1: 3}},
    "cxl-expander": {"hbw": [], "dax_kmem": [1], "local": {0: None}},
}
#: the plan as a Slurm job on the Slurm node, from this host: as checks.py runs it elsewhere,
#: a rank per CPU node, few sizes and iterations
JOB = """#!/bin/sh
# the node's own configuration (configless, /run/slurm/conf), as a site's jobs have it
unset SLURM_CONF
slurmd -V >slurmd-version
srun --mpi=pmix hpcmem bind hbw -- hpcmem collectives --op allreduce --buffer hbw \\
  --min-size 8 --max-size 64 --iterations 5 --warmup 1 --native-loop off --output records.jsonl
"""

REFERENCES = Path(__file__).resolve().parents[1] / "config" / "references.yaml"

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The module's guests, each booted when first asked for; all ended after it."""
    if reason := unsupported():
        pytest.skip(reason)
    with ExitStack() as stack:
        guests = Fleet(tmp_path_factory.mktemp, stack)
        try:
            yield guests
        finally:
            guests.stop()


# the Slurm node last: it serves the module's last tests, booted after every other guest ended
@pytest.fixture(scope="module", params=sorted(EXPECTED, key=lambda name: name == SLURM_NODE))
def guest(request: pytest.FixtureRequest, fleet: Fleet) -> tuple[str, dict[str, Any]]:
    """The topology's name and what checks.py found inside it."""
    return request.param, fleet.checks(request.param)


def _cpus(info: dict[str, Any], node: int) -> set[int]:
    return set(next(n["cpus"] for n in info["numa_nodes"] if n["id"] == node))


def test_info_names_the_hbm_and_cxl_nodes_without_any_override(guest) -> None:
    name, checks = guest
    info, expected = checks["info"], EXPECTED[name]
    source = "hmat" if expected["hbw"] else "none"
    assert info["hbw"] == {"nodes": expected["hbw"], "source": source, "emulated": False}
    assert info["dax_kmem"] == {"nodes": expected["dax_kmem"],
                                "source": "hmat" if expected["dax_kmem"] else "none"}
    assert info["hbw_backend"]["name"] == "umf"
    # UMF agrees: its highest-bandwidth nodes are the HBM, else the DDR
    assert info["hbw_backend"]["highest_bandwidth"] == (expected["hbw"] or list(expected["local"]))
    memory_only = [n["id"] for n in info["numa_nodes"] if not n["cpus"]]
    assert memory_only == sorted(expected["hbw"] + expected["dax_kmem"])
    nodes = {n["id"]: n for n in info["numa_nodes"]}
    for cxl in expected["dax_kmem"]:  # slower and farther than every DDR node
        for ddr in expected["local"]:
            assert nodes[cxl]["read_bandwidth_MBps"] < nodes[ddr]["read_bandwidth_MBps"]
            assert nodes[cxl]["read_latency_ns"] > nodes[ddr]["read_latency_ns"]


def _expected_kinds(name: str, node: int) -> dict[str, set[int]]:
    """Per kind the guest serves, the nodes every page must land on from CPU node ``node``."""
    hbw, local, dax_kmem = (EXPECTED[name][key] for key in ("hbw", "local", "dax_kmem"))
    kinds = {"dram": {node}, "hbw_preferred": {local[node] if hbw else node}}
    if hbw:
        kinds.update(hbw={local[node]}, hbw_interleave=set(hbw))
    return {**kinds, "dax_kmem": set(dax_kmem)} if dax_kmem else kinds


def test_every_kind_lands_on_the_nodes_it_should(guest) -> None:
    name, checks = guest
    hbw = EXPECTED[name]["hbw"]
    assert {key.split("/")[0] for key in checks["kinds"]} >= {"umf"}
    for key, found in checks["kinds"].items():
        backend, cpu_node = key.split("/")
        node = int(cpu_node.removeprefix("cpu"))
        assert found["backend"]["name"] == backend
        assert set(found["cpus"]) <= _cpus(checks["info"], node)
        expected = _expected_kinds(name, node)
        assert set(found) - {"backend", "cpus", "numa_scan"} == set(expected)
        # measured after a whole NUMA balancing scan: pages it hid are found all the same
        assert found["numa_scan"]["balancing"] and found["numa_scan"]["scans"] >= 2, key
        for kind, nodes in expected.items():
            record = found[kind]
            where = {int(n): count for n, count in record["nodes"].items()}
            assert set(where) == nodes, (key, kind, json.dumps(record))  # every page there
            assert record["untouched"] == 0 and sum(where.values()) == record["pages"]
            assert record["emulated"] is False
            assert record["source"] == ("hmat" if hbw else "none")
            on_hbw = bool(nodes & set(hbw))
            assert record["hbw_fraction"] == ((1.0 if on_hbw else 0.0) if hbw else None)
            if hbw:  # the backend's own HBW check (it has nothing to check against without)
                assert record["verify"] is on_hbw, (key, kind, record)
        if len(hbw) == 2:
            spread = [count / found["hbw_interleave"]["pages"]
                      for count in found["hbw_interleave"]["nodes"].values()]
            assert min(spread) > 0.4


def test_the_plan_puts_each_rank_on_its_cores_and_memory(guest, request) -> None:
    """``hpcmem bind hbw`` with a rank per CPU node, two on one (under ``mpirun``; on the
    Slurm node, a job's ``srun``): each rank on a CPU node, round robin, its memory bound to
    that node's HBM, and the HBW points run there and validate; refused, saying why, without
    HBM."""
    name, checks = guest
    local = EXPECTED[name]["local"]
    if name == SLURM_NODE and "plan" not in checks:
        plan = guest_checks().plan_summary(request.getfixturevalue("hbm_job")["records"])
    else:
        plan = checks["plan"]
    if not EXPECTED[name]["hbw"]:
        assert plan["returncode"] == 2
        assert "this node has no high-bandwidth memory node" in plan["error"]
        return
    cpu_nodes = sorted(local)
    ranks = sorted(plan["ranks"], key=lambda rank: rank["local_rank"])
    assert [rank["local_rank"] for rank in ranks] == list(range(
        guest_checks().plan_ranks(len(cpu_nodes))))
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
    """Buffers on every node (HBM and CXL ones too) x ranks on every CPU node: one run per
    memory node with a rank on each CPU node, every rank's memory bound to that node."""
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
        assert cell["hbw_sources"] == ["hmat" if EXPECTED[name]["hbw"] else "none"]
        assert cell["hbw_backend"] == ["umf"]
    record = checks["record"]
    assert validate_record(record) == []
    assert record["vm_topology"]["name"] == name
    assert "not the hardware's" in record["vm_topology"]["note"]


# --- the Slurm node: partition hbm of the VM node's cluster -------------------------------


def _slurm(fleet: Fleet) -> SlurmCluster:
    if fleet.cluster is None:
        pytest.skip(f"no Slurm for the VM node: {slurm_unsupported()}")
    return fleet.cluster


def _wait(what: str, ready, guest: Guest) -> None:
    """Until ``ready()``; fails naming ``what`` when the guest ends or its time is up."""
    while not ready():
        assert guest.process.poll() is None, f"{guest.topology} ended before {what}"
        assert time.monotonic() < guest.started + GUEST_SECONDS, f"no {what}"
        time.sleep(1)


@pytest.fixture(scope="module")
def hbm_job(fleet: Fleet) -> dict[str, Any]:
    """One job submitted from this host to partition hbm (constraint hbm), run to its end:
    its id, its sacct line, the guest's slurmd version and the records it wrote."""
    fleet.checks(SLURM_NODE)  # booted, and its checks done
    cluster, guest = _slurm(fleet), fleet.guests[SLURM_NODE]

    def idle() -> bool:
        state = cluster.run("sinfo", "-h", "-N", "-n", SLURM_NODE, "-o", "%T").stdout.strip()
        return state in ("idle", "mixed", "allocated")

    _wait(f"node {SLURM_NODE} idle", idle, guest)
    script = fleet.scratch / "hbw.sh"
    script.write_text(JOB)
    ranks = guest_checks().plan_ranks(len(EXPECTED[SLURM_NODE]["local"]))
    submitted = cluster.run("sbatch", "--parsable", "-p", "hbm", "--constraint=hbm",
                            "-n", str(ranks), "--time=10", f"--chdir={fleet.scratch}",
                            f"--output={fleet.scratch}/job-%j.out", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def sacct() -> str:
        return cluster.run("sacct", "-n", "-X", "-P", "-j", job,
                           "-o", "state,partition,nodelist").stdout.strip()

    _wait(f"end of job {job}", lambda: sacct().split("|")[0] not in ("", "PENDING", "RUNNING"),
          guest)
    output = fleet.scratch / f"job-{job}.out"
    records = fleet.scratch / "records.jsonl"
    said = output.read_text() if output.exists() else ""
    assert records.exists(), f"job {job} ({sacct()}) wrote no records:\n{said[-3000:]}"
    return {"job": job, "sacct": sacct(), "output": said,
            "slurmd": (fleet.scratch / "slurmd-version").read_text().strip(),
            "records": [json.loads(line) for line in records.read_text().splitlines()]}


def test_the_hbm_partition_is_the_vm_node(fleet: Fleet) -> None:
    cluster = _slurm(fleet)
    shown = cluster.run("sinfo", "-h", "-N", "-p", "hbm", "-o", "%N|%f|%c|%X|%Y")
    assert shown.stdout.split() == [f"{SLURM_NODE}|hbm,flat,snc2|4|2|2"]  # CPUs, sockets, cores


def test_hbw_points_run_on_the_vm_node_as_a_site_would_run_them(hbm_job) -> None:
    """The job ran in partition hbm on the guest, whose Slurm is the host's; every record says
    it came from that node, in a VM of that topology, each rank bound to its CPU node and that
    node's HBM (the plan's test checks the kernel applied it) and every page there."""
    assert hbm_job["sacct"] == f"COMPLETED|hbm|{SLURM_NODE}", hbm_job["output"][-3000:]
    host = subprocess.run(["slurmd", "-V"], capture_output=True, text=True).stdout.strip()
    assert hbm_job["slurmd"] == host
    records = hbm_job["records"]
    assert [r["buffer"] for r in records] == ["hbw"] * 4  # one per size
    local = EXPECTED[SLURM_NODE]["local"]
    for record in records:
        assert validate_record(record) == []
        assert record["status"] == "ok" and record["validated"]
        assert record["host"] == SLURM_NODE and record["hosts"] == [SLURM_NODE]
        assert record["system"] == "hpcmem:hbm" and record["slurm_job_id"] == hbm_job["job"]
        assert record["vm_topology"]["name"] == SLURM_NODE
        placement = record["placement"]
        assert placement["emulated"] is False and placement["hbw_sources"] == ["hmat"]
        assert {int(node) for node in placement["nodes"]} == set(local.values())
        assert placement["hbw_fraction"] == 1.0 and placement["untouched"] == 0
        for rank in record["binding"]["per_rank"]:
            cpu_node = rank["local_rank"] % len(local)
            assert rank["host"] == SLURM_NODE
            assert rank["numactl"] == [f"--cpunodebind={cpu_node}", f"--membind={local[cpu_node]}"]
            assert rank["mempolicy"] == {"mode": "bind", "nodes": [local[cpu_node]]}


def test_the_vm_node_s_figures_are_reported_apart_and_judged_against_nothing(
        hbm_job, tmp_path) -> None:
    """Its records summarised, checked (the shipped references, a history) and reported
    here, as a site's nightly would: every figure UNJUDGED for system vm:<topology>, none in
    the history, the points in the report's section of virtual machines."""
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in hbm_job["records"]))
    summary, verdict, history = tmp_path / "summary", tmp_path / "verdict.json", tmp_path / "h"
    assert main(["aggregate", str(records), "--out", str(summary)]) == 0
    assert main(["check", str(summary), "--references", str(REFERENCES),
                 "--history", str(history), "--verdict-out", str(verdict)]) == 1
    rows = json.loads(verdict.read_text())["figures"]
    assert rows and {(row["verdict"], row["system"]) for row in rows} == {
        ("UNJUDGED", f"vm:{SLURM_NODE}")}
    if (history / "history.sqlite").exists():
        with sqlite3.connect(history / "history.sqlite") as db:
            assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    report = tmp_path / "report.html"
    assert main(["report", str(summary), "--verdict", str(verdict), "--out", str(report)]) == 0
    assert f"<h2>Virtual machines ({SLURM_NODE})</h2>" in report.read_text()
