"""Everything the VM tests check, run once inside a tools/vm guest with no HBW override.

    python tools/vm/guest/checks.py OUT.json [--no-plan]

It writes one JSON object that tests/test_vm_topologies.py asserts on:

``info``      ``hpcmem info --json``: the NUMA, HBW and DAX KMEM nodes and the backend
``kinds``     per backend built in and per CPU node (the process bound there by numactl),
              where the pages of a written array of each kind the node has landed (``dram``
              and ``hbw_preferred`` always, the HBW kinds with HBW nodes, ``dax_kmem`` with a
              DAX KMEM tier), measured after NUMA balancing has scanned them once
              (:func:`await_numa_scan`)
``plan``      ``mpirun -n N hpcmem bind hbw -- hpcmem collectives`` on hbw buffers, a rank
              per CPU node and at least two (:func:`plan_ranks`): per rank the numactl
              arguments the plan gave and what the kernel applied (CPUs, memory policy), and
              where the pages were (:func:`plan_summary`); without HBW nodes, the refusal of
              ``hpcmem bind hbw``; with ``--no-plan``, nothing (a Slurm job runs the plan
              there instead)
``matrix``    per memory node: one ``hpcmem collectives`` run (MPI's MPMD form) with ranks
              on every CPU node and every rank's buffers bound to that memory node, so the
              runs cover the seed's buffer location x processor location; summarised from
              the records
``record``    one full record of the matrix, as written

Guest work runs 10-20x slower than on a host, so the children are few and those that can
run at once (one per CPU node) do; MPI ranks yield the CPU while they wait, as they may
outnumber the guest's CPUs and the host's.

The subcommand ``kinds KIND,...`` is what its children run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
#: cleared for every check: the platform, not a declaration, must name the HBW nodes
OVERRIDES = ("HPCMEM_HBW_NODES", "MEMKIND_HBW_NODES", "HPCMEM_HBW_BACKEND")
#: a few small sizes, few iterations: the points must run and validate, not be figures
POINTS = ["--min-size", "8", "--max-size", "64", "--iterations", "5", "--warmup", "1",
          "--native-loop", "off"]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OVERRIDES}
    return {**env, "OMPI_MCA_mpi_yield_when_idle": "1", **extra}


def run_all(commands: list[list[str]], **extra: str) -> list[str]:
    """Run ``commands`` at once; their outputs, or RuntimeError naming the first that failed."""
    children = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=environment(**extra)) for c in commands]
    outputs = [child.communicate(timeout=300) for child in children]
    for command, child, (_, stderr) in zip(commands, children, outputs, strict=True):
        if child.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: exit {child.returncode}\n{stderr[-3000:]}")
    return [stdout for stdout, _ in outputs]


def run(command: list[str], **extra: str) -> str:
    return run_all([command], **extra)[0]


def kinds(names: list[str]) -> dict[str, Any]:
    """Child: where the pages of each kind of ``names`` land for this process (bound by
    numactl), and the backend's own HBW check of them (or why it could not check)."""
    import warnings

    from hpcmem import hbw

    warnings.simplefilter("ignore", hbw.HBWFallbackWarning)  # hbw_preferred without HBW
    out: dict[str, Any] = {"backend": hbw.backend().to_record(),
                           "cpus": sorted(os.sched_getaffinity(0))}
    arrays = {kind: hbw.zeros(4 * MiB, "uint8", kind=kind) for kind in names}
    out["numa_scan"] = await_numa_scan()
    for kind, array in arrays.items():
        out[kind] = hbw.placement(array).to_record()
        try:
            out[kind]["verify"] = hbw.verify(array)
        except OSError as error:
            out[kind]["verify"] = str(error)
    return out


def _numa_scan_seq() -> int:
    """How many NUMA balancing scans of this process's memory have begun."""
    with open("/proc/self/sched") as sched:
        line = next(line for line in sched if line.startswith("mm->numa_scan_seq"))
    return int(line.split(":")[1])


def await_numa_scan(most_seconds: float = 60) -> dict[str, Any]:
    """Keep the CPU busy until NUMA balancing has scanned all of this process's memory once
    (two scans begun), so the pages measured next are the PROT_NONE ones it leaves behind,
    which some kernels' move_pages(2) reports as never touched. Scans run from the timer
    tick of a running task: a sleeping one is never scanned."""
    with open("/proc/sys/kernel/numa_balancing") as setting:
        if setting.read().strip() == "0":
            return {"balancing": False, "scans": 0}
    begun = time.monotonic()
    first = _numa_scan_seq()
    while _numa_scan_seq() < first + 2 and time.monotonic() - begun < most_seconds:
        sum(range(100_000))
    return {"balancing": True, "scans": _numa_scan_seq() - first}


def quicken_numa_balancing() -> None:
    """Scan a process's memory from its start and every 100-200 ms (the kernel's are 1 s,
    then up to 60 s), so :func:`await_numa_scan` waits for a fraction of a second."""
    debug = Path("/sys/kernel/debug")
    if not (debug / "sched").exists():
        subprocess.run(["mount", "-t", "debugfs", "debugfs", str(debug)], check=True)
    knobs = {"scan_delay_ms": 0, "scan_period_min_ms": 100, "scan_period_max_ms": 200}
    for knob, value in knobs.items():
        (debug / "sched" / "numa_balancing" / knob).write_text(str(value))


def _cpu_nodes(info: dict[str, Any]) -> list[int]:
    return [n["id"] for n in info["numa_nodes"] if n["cpus"]]


def _kinds_here(info: dict[str, Any]) -> list[str]:
    """The kinds this guest's tiers serve."""
    names = ["dram", "hbw_preferred"]
    names += ["hbw", "hbw_interleave"] if info["hbw"]["nodes"] else []
    return names + (["dax_kmem"] if info["dax_kmem"]["nodes"] else [])


def _kinds_everywhere(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from hpcmem import _hbw

    names = ",".join(_kinds_here(info))
    keys = [(backend, node) for backend in _hbw.BACKENDS for node in _cpu_nodes(info)]
    commands = [["env", f"HPCMEM_HBW_BACKEND={backend}", "numactl", f"--cpunodebind={node}",
                 sys.executable, __file__, "kinds", names] for backend, node in keys]
    return {f"{backend}/cpu{node}": json.loads(out)
            for (backend, node), out in zip(keys, run_all(commands), strict=True)}


def _records(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def _refused_plan() -> dict[str, Any]:
    """``hpcmem bind hbw`` where there is no HBW node: its exit status and last line."""
    done = subprocess.run(["hpcmem", "bind", "hbw", "--", "true"], capture_output=True,
                          text=True, env=environment(), timeout=300)
    return {"returncode": done.returncode, "error": done.stderr.strip().splitlines()[-1]}


def plan_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the records of one run under ``hpcmem bind`` say of its plan: per rank the
    numactl arguments, CPUs and memory policy, and per buffer kind where the pages were
    (shared with the host's test of the same plan run as a Slurm job)."""
    ranks = records[0]["binding"]["per_rank"]
    return {
        "ranks": [{key: rank[key] for key in ("local_rank", "numactl", "cpus", "mempolicy")}
                  for rank in ranks],
        "statuses": sorted({r["status"] for r in records}),
        "validated": all(r.get("validated") for r in records),
        "placement": {r["buffer"]: r["placement"] for r in records},
    }


def plan_ranks(cpu_nodes: int) -> int:
    """How many ranks the plan runs with: one per CPU node, and two where there is one."""
    return max(2, cpu_nodes)


def _plan(info: dict[str, Any], folder: Path) -> dict[str, Any]:
    output = folder / "plan.jsonl"
    ranks = plan_ranks(len(_cpu_nodes(info)))
    run(["mpirun", "-n", str(ranks), "hpcmem", "bind", "hbw", "--", "hpcmem", "collectives",
         "--op", "allreduce", "--buffer", "hbw", *POINTS,
         "--output", str(output)])
    return plan_summary(_records(output))


def _node_of(info: dict[str, Any], cpus: list[int]) -> list[int]:
    """The NUMA nodes holding ``cpus``."""
    return sorted({n["id"] for n in info["numa_nodes"] for c in cpus if c in n["cpus"]})


def _matrix(info: dict[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    cells: dict[str, Any] = {}
    sample: dict[str, Any] = {}
    cpu_nodes = _cpu_nodes(info)
    per_node = max(1, 2 // len(cpu_nodes))  # two ranks in all, at least one per CPU node
    for memory_node in (n["id"] for n in info["numa_nodes"]):
        output = folder / f"matrix-{memory_node}.jsonl"
        contexts: list[str] = []
        for cpu_node in cpu_nodes:
            numactl = [f"--cpunodebind={cpu_node}", f"--membind={memory_node}"]
            contexts += [":", "-n", str(per_node), "-x", f"HPCMEM_NUMACTL_ARGS={' '.join(numactl)}",
                         "numactl", *numactl, "hpcmem", "collectives",
                         "--op", "allreduce,bcast,gather", "--buffer", "numpy", *POINTS,
                         "--output", str(output)]
        run(["mpirun", *contexts[1:]], HPCMEM_BINDING="custom")
        records = _records(output)
        sample = records[-1]
        ranks = [rank for r in records for rank in r["binding"]["per_rank"]]
        cells[str(memory_node)] = {
            "records": len(records),
            "statuses": sorted({r["status"] for r in records}),
            "validated": all(r.get("validated") for r in records),
            "nodes": sorted({n for r in records for n in r["placement"]["nodes"]}),
            "rank_nodes": sorted({tuple(_node_of(info, rank["cpus"])) for rank in ranks}),
            "rank_mempolicies": sorted({json.dumps(rank["mempolicy"]) for rank in ranks}),
            "emulated": sorted({r["placement"]["emulated"] for r in records}),
            "hbw_sources": sorted({s for r in records for s in r["placement"]["hbw_sources"]}),
            "vm_topology": sorted({r.get("vm_topology", {}).get("name", "") for r in records}),
            "hbw_backend": sorted({r["hbw_backend"]["name"] for r in records}),
        }
    return cells, sample


def main(out: str, plan: bool) -> None:
    started = time.monotonic()
    seconds: dict[str, float] = {}

    def timed(name: str, call):
        begun = time.monotonic()
        value = call()
        seconds[name] = round(time.monotonic() - begun, 1)
        return value

    scratch = Path("/tmp/hpcmem-vm-checks")
    quicken_numa_balancing()
    info = timed("info", lambda: json.loads(run(["hpcmem", "info", "--json"])))
    result: dict[str, Any] = {"info": info}
    result["kinds"] = timed("kinds", lambda: _kinds_everywhere(info))
    scratch.mkdir(parents=True, exist_ok=True)
    if plan:
        result["plan"] = timed("plan", (lambda: _plan(info, scratch)) if info["hbw"]["nodes"]
                               else _refused_plan)
    result["matrix"], result["record"] = timed("matrix", lambda: _matrix(info, scratch))
    result["seconds"] = {**seconds, "total": round(time.monotonic() - started, 1)}
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "kinds":
        print(json.dumps(kinds(sys.argv[2].split(","))))
    else:
        main(sys.argv[1], plan="--no-plan" not in sys.argv[2:])
