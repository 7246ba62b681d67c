"""numactl bindings: planning from a topology, strict validation, and `hpcmem bind` run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcmem.node.applied import binding_label
from hpcmem.node.launcher import LOCAL_RANK_VARIABLES
from hpcmem.node.planned import BindingError, BindingUnavailableError, plan_binding
from hpcmem.node.topology import HBWNodes, NumaNode
from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

GiB = 1 << 30
#: a Xeon Max-like node: two CPU nodes with DRAM, two memory-only HBM nodes
XEON_MAX = [
    NumaNode(0, (0, 1, 2, 3), 64 * GiB, 60 * GiB),
    NumaNode(1, (4, 5, 6, 7), 64 * GiB, 60 * GiB),
    NumaNode(2, (), 16 * GiB, 16 * GiB),
    NumaNode(3, (), 16 * GiB, 16 * GiB),
]
HBM = HBWNodes((2, 3), "hmat", emulated=False)
NO_HBW = HBWNodes((), "none", emulated=False)
CHILD = "import json; from hpcmem.node import applied; print(json.dumps(applied.current()))"


def plan(binding: str, rank: int = 0, hbw: HBWNodes = HBM) -> list[str]:
    return list(plan_binding(binding, rank, nodes=XEON_MAX, hbw=hbw).args)


@pytest.mark.parametrize(
    ("binding", "rank", "expected"),
    [
        ("none", 3, []),
        ("hbw", 0, ["--cpunodebind=0", "--membind=2-3"]),
        ("hbw", 1, ["--cpunodebind=1", "--membind=2-3"]),
        ("dram", 1, ["--cpunodebind=1", "--membind=1"]),
        ("dram", 2, ["--cpunodebind=0", "--membind=0"]),
        ("interleave", 1, ["--cpunodebind=1", "--interleave=0-3"]),
        ("--cpunodebind=1 --membind=3", 0, ["--cpunodebind=1", "--membind=3"]),
        ("--physcpubind=4-7 --preferred=2", 5, ["--physcpubind=4-7", "--preferred=2"]),
        ("--interleave=all", 0, ["--interleave=all"]),
        ("--localalloc", 0, ["--localalloc"]),
    ],
)
def test_bindings_on_a_xeon_max_topology(binding: str, rank: int, expected: list[str]) -> None:
    assert plan(binding, rank) == expected


def test_hbw_binds_each_rank_to_the_hbm_nearest_its_cpus() -> None:
    """Xeon Max in SNC-2 flat mode: each DDR node has its own HBM node, by SLIT distance."""
    slit = {0: {0: 10, 1: 21, 2: 13, 3: 23}, 1: {0: 21, 1: 10, 2: 23, 3: 13}}
    snc2 = [NumaNode(n.id, n.cpus, n.memory_total, n.memory_free, distances=slit.get(n.id, {}))
            for n in XEON_MAX]
    plans = [list(plan_binding("hbw", rank, nodes=snc2, hbw=HBM).args) for rank in range(4)]
    assert plans == [["--cpunodebind=0", "--membind=2"], ["--cpunodebind=1", "--membind=3"]] * 2


def test_cores_spreads_local_ranks_over_the_allowed_cpus() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    for rank in range(2 * len(allowed)):
        cpu = allowed[rank % len(allowed)]
        assert plan("cores", rank) == [f"--physcpubind={cpu}", "--localalloc"]


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        ("--membind=7", "binding --membind='7': node 7 does not exist (nodes here: 0-3)"),
        ("--cpunodebind=0-4", "node 4 does not exist (nodes here: 0-3)"),
        ("--physcpubind=8", "CPU 8 does not exist (CPUs here: 0-7)"),
        ("--membind=0 --interleave=1", "--membind and --interleave are exclusive memory policies"),
        ("--membind=0 --membind=1", "--membind given twice"),
        ("--cpubind=0", "'--cpubind=0' is not one of none, cores, hbw, dram, interleave"),
        ("--membind", "--membind needs a value"),
        ("--membind=x", "'x' is not a node or a range"),
        ("--preferred=2,3", "--preferred takes one node"),
        ("--localalloc=1", "--localalloc takes no value"),
        ("--membind=0; rm -rf /", "'0;' is not a node or a range"),
        ("hbm", "binding 'hbm' is not one of none, cores, hbw, dram, interleave"),
    ],
)
def test_bad_bindings_name_the_value_and_what_is_accepted(binding: str, message: str) -> None:
    with pytest.raises(BindingError) as error:
        plan(binding)
    assert message in str(error.value)


def test_hbw_without_hbw_nodes_is_refused() -> None:
    with pytest.raises(BindingError, match="HPCMEM_HBW_NODES"):
        plan("hbw", hbw=NO_HBW)


def test_hbw_on_a_node_without_hbw_is_unavailable_not_malformed() -> None:
    with pytest.raises(BindingUnavailableError):
        plan_binding("hbw", 0, nodes=XEON_MAX, hbw=NO_HBW)


def test_an_unavailable_binding_can_be_planned_as_skipped() -> None:
    skipped = plan_binding("hbw", 3, nodes=XEON_MAX, hbw=NO_HBW, skip_unavailable=True)
    assert (skipped.binding, skipped.local_rank, skipped.args) == ("hbw", 3, ())
    assert skipped.command_prefix == []
    env = skipped.environment()
    assert env["HPCMEM_BINDING"] == "hbw" and env["HPCMEM_NUMACTL_ARGS"] == ""
    assert "no high-bandwidth memory node" in env["HPCMEM_SKIP_REASON"]
    bound = plan_binding("dram", 0, nodes=XEON_MAX, hbw=NO_HBW, skip_unavailable=True)
    assert "HPCMEM_SKIP_REASON" not in bound.environment() and bound.skip_reason is None


@pytest.mark.parametrize("binding", ["--membind=7", "--cpunodebind=0 --physcpubind=64"])
def test_explicit_nodes_and_cpus_that_do_not_exist_are_refused(binding: str) -> None:
    with pytest.raises(BindingError, match="does not exist") as error:
        plan_binding(binding, 0, nodes=XEON_MAX, hbw=NO_HBW)
    assert not isinstance(error.value, BindingUnavailableError)


@pytest.mark.parametrize("binding", ["hbm", "--membind=0 --interleave=1", "--membind", "--x=1"])
def test_malformed_bindings_are_not_unavailable(binding: str) -> None:
    with pytest.raises(BindingError) as error:
        plan_binding(binding, 0, nodes=XEON_MAX, hbw=HBM)
    assert not isinstance(error.value, BindingUnavailableError)


def _bind(hpcmem_exe: str, *args: str, env: dict[str, str] | None = None):
    full_env = dict(os.environ)
    for name in (*LOCAL_RANK_VARIABLES, "MEMKIND_HBW_NODES"):
        full_env.pop(name, None)
    full_env.update(env or {})
    return subprocess.run(
        [hpcmem_exe, "bind", *args], capture_output=True, text=True, env=full_env, timeout=60
    )


@pytest.mark.parametrize(
    ("binding", "mode"),
    [("none", "default"), ("dram", "bind"), ("hbw", "bind"), ("interleave", "interleave")],
)
def test_bind_applies_the_policy_seen_from_inside(hpcmem_exe: str, binding: str, mode: str) -> None:
    result = _bind(
        hpcmem_exe, binding, "--", sys.executable, "-c", CHILD, env={"MEMKIND_HBW_NODES": "0"}
    )
    assert result.returncode == 0, result.stderr
    applied = json.loads(result.stdout)
    assert applied["name"] == binding
    assert applied["mempolicy"]["mode"] == mode
    if binding == "none":
        assert applied["numactl"] == []
        assert applied["cpus"] == sorted(os.sched_getaffinity(0))
    else:
        assert applied["mempolicy"]["nodes"] == [0]
        assert applied["numactl"][0] == "--cpunodebind=0"


def test_bind_cores_pins_each_local_rank(hpcmem_exe: str) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    for rank in (0, 1):
        result = _bind(hpcmem_exe, "--local-rank", str(rank), "cores", "--",
                       sys.executable, "-c", CHILD)  # fmt: skip
        assert result.returncode == 0, result.stderr
        applied = json.loads(result.stdout)
        assert applied["cpus"] == [allowed[rank % len(allowed)]]
        assert applied["mempolicy"]["mode"] == "local"


def test_bind_explicit_arguments_after_separator(hpcmem_exe: str) -> None:
    result = _bind(hpcmem_exe, "--", "--membind=0", "--", sys.executable, "-c", CHILD)
    assert result.returncode == 0, result.stderr
    applied = json.loads(result.stdout)
    assert applied["name"] == "custom"
    assert applied["numactl"] == ["--membind=0"]
    assert applied["mempolicy"] == {"mode": "bind", "nodes": [0]}


def test_bind_name_is_the_name_the_records_give_the_binding(hpcmem_exe: str) -> None:
    # the workflow's custom binding node0: its folder, its records and their key say node0
    result = _bind(hpcmem_exe, "--name", "node0", "--", "--membind=0", "--",
                   sys.executable, "-c", CHILD)  # fmt: skip
    assert result.returncode == 0, result.stderr
    applied = json.loads(result.stdout)
    assert (applied["name"], applied["numactl"]) == ("node0", ["--membind=0"])
    assert binding_label(applied) == "node0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "Node 0", "none", "--", "true"], "--name: 'Node 0' is not a binding name"),
        (["--", "--membind=9", "--", "true"], "node 9 does not exist (nodes here: 0)"),
        (["hbw", "--", "true"], "binding 'hbw': this node has no high-bandwidth memory node"),
        (["fast", "--", "true"], "binding 'fast' is not one of none, cores, hbw"),
        (["none"], "COMMAND: missing"),
        (["none", "--", "/no/such/program"], "COMMAND '/no/such/program'"),
    ],
)
def test_bind_errors_are_one_line(hpcmem_exe: str, args: list[str], message: str) -> None:
    result = _bind(hpcmem_exe, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("hpcmem bind: error: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.mpi
def test_bind_under_mpirun_pins_ranks_apart(mpirun, hpcmem_exe: str) -> None:
    result = mpirun(2, hpcmem_exe, "bind", "cores", "--", sys.executable, "-c", CHILD,
                    env={"OMPI_MCA_hwloc_base_binding_policy": "none"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    cpus = sorted(json.loads(line)["cpus"][0] for line in result.stdout.splitlines())
    allowed = sorted(os.sched_getaffinity(0))
    assert cpus == sorted(allowed[r % len(allowed)] for r in range(2))


SKIP_CHILD = "import os; print(os.environ.get('HPCMEM_SKIP_REASON'))"


def test_skip_unavailable_runs_the_command_unbound_with_the_reason(hpcmem_exe: str) -> None:
    result = _bind(hpcmem_exe, "--skip-unavailable", "hbw", "--", sys.executable, "-c",
                   f"{CHILD}; {SKIP_CHILD}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    applied, reason = result.stdout.splitlines()
    assert json.loads(applied)["numactl"] == [] and json.loads(applied)["name"] == "hbw"
    assert json.loads(applied)["mempolicy"]["mode"] == "default"  # no numactl ran
    assert reason.startswith("binding 'hbw': this node has no high-bandwidth memory node")
    bound = _bind(hpcmem_exe, "--skip-unavailable", "dram", "--", sys.executable, "-c", SKIP_CHILD)
    assert bound.returncode == 0 and bound.stdout == "None\n"  # applicable: applied as usual


@pytest.mark.parametrize("binding", ["fast", "--membind=0 --interleave=0"])
def test_skip_unavailable_still_refuses_malformed_bindings(hpcmem_exe: str, binding: str) -> None:
    result = _bind(hpcmem_exe, "--skip-unavailable", "--", binding, "--", "true")
    assert result.returncode == 2 and result.stderr.startswith("hpcmem bind: error: binding")


@pytest.mark.mpi
def test_unavailable_binding_under_mpirun_becomes_skipped_records(
    mpirun, hpcmem_exe: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("MEMKIND_HBW_NODES", raising=False)
    output = tmp_path / "r.jsonl"
    collectives = [hpcmem_exe, "collectives", "--op", "allreduce,barrier", "--buffer",
                   "numpy,hbw", "--max-size", "16", "--output", str(output)]  # fmt: skip
    refused = mpirun(2, hpcmem_exe, "bind", "hbw", "--", *collectives)
    assert refused.returncode == 2 and not output.exists()
    assert "binding 'hbw': this node has no high-bandwidth memory node" in refused.stderr

    result = mpirun(2, hpcmem_exe, "bind", "--skip-unavailable", "hbw", "--", *collectives)
    assert result.returncode == 0, result.stderr
    records = read_records(output)
    assert [validate_record(r) for r in records] == [[]] * 8  # allreduce: 3 sizes x 2, barrier 2
    assert {(r["op"], r["buffer"]) for r in records} == {
        (op, buffer) for op in ("allreduce", "barrier") for buffer in ("numpy", "hbw")
    }
    assert {r["status"] for r in records} == {"skipped"} and {r["ranks"] for r in records} == {2}
    assert {r["reason"] for r in records} == {
        "binding 'hbw': this node has no high-bandwidth memory node (declare one for emulation "
        "with HPCMEM_HBW_NODES=<nodes>, or use binding dram)"
    }
    assert all(rank["numactl"] == [] for r in records for rank in r["binding"]["per_rank"])
    assert result.stdout.count("# skipped: binding 'hbw'") == 4
    assert "Avg Latency(us)" in result.stdout and not any(
        line[:1].isdigit() for line in result.stdout.splitlines()
    )  # headers only: no row was measured
