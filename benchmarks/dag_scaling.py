"""How long Snakemake takes to build the DAG of a 1,000-point sweep (target: under 10 s).

Writes a 1,000-point config (900 collectives points, 100 training points) into a scratch
working directory, times ``snakemake --profile profiles/local -n --quiet`` on it (the whole
process: start-up, config validation, DAG of 1,006 jobs), and records the timings with
the date, machine and command in ``benchmarks/results/dag_scaling.json``. Exit status 1
when the slowest round exceeds the target.

    .venv/bin/python benchmarks/dag_scaling.py [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 10.0

#: 9 ops x 5 buffers x 4 rank counts (on one node) x 5 bindings = 900 collectives points
#: 2 models x 5 sizes x 5 policies x 2 budgets = 100 training points
SWEEP = {
    "run_id": "dag1000",
    "collectives": {
        "ops": ["bcast", "gather", "allreduce", "reduce", "allgather", "alltoall", "scatter",
                "reduce_scatter", "barrier"],
        "buffers": ["numpy", "hbw", "hbw_preferred", "hbw_interleave", "mpi_alloc"],
        "tasks_per_node": [2, 4, 8, 16],
        "bindings": ["none", "cores", "hbw", "dram", "interleave"],
        "max_size": "4M",
        "emulate_hbw": "0",
    },
    "train": {
        "models": ["transformer", "cnn"],
        "params": ["125M", "350M", "1.3B", "6B", "13B"],
        "policies": ["cuda", "um", "hpcmem", "host_inputs", "gpu_all"],
        "policy_files": {"host_inputs": "config/host_inputs.yaml",
                         "gpu_all": "config/gpu_all.yaml"},
        "gpu_budgets": ["none", "40G"],
    },
}


def points(sweep: dict) -> int:
    """Number of benchmark points of ``sweep``."""
    coll, train = sweep["collectives"], sweep["train"]
    return (len(coll["ops"]) * len(coll["buffers"]) * len(coll["tasks_per_node"])
            * len(coll["bindings"])
            + len(train["models"]) * len(train["params"]) * len(train["policies"])
            * len(train["gpu_budgets"]))


def time_dry_run(command: list[str]) -> float:
    """Wall seconds of one dry run; a failed run raises."""
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stderr}{result.stdout}")
    return elapsed


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or the platform's processor string."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match[1] if match else platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed dry runs (default 3)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/dag_scaling.json",
                        help="where to record the result")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is not a whole number >= 1")
    snakemake = Path(sys.executable).parent / "snakemake"
    with tempfile.TemporaryDirectory(prefix="hpcmem-dag-") as scratch:
        workdir = Path(scratch)
        (workdir / "config").mkdir()
        (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(SWEEP))
        (workdir / "config" / "references.yaml").write_text("references: {}\n")
        command = [str(snakemake), "--profile", "profiles/local", "-n", "--quiet", "--snakefile",
                   "workflow/Snakefile", "--directory", str(workdir)]  # run in REPO
        rounds = [time_dry_run(command) for _ in range(args.rounds)]
    record = {
        "benchmark": "dag_scaling",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "snakemake": subprocess.run([str(snakemake), "--version"], capture_output=True,
                                    text=True, check=True).stdout.strip(),
        "command": shlex.join(["snakemake", *command[1:]]).replace(scratch, "$SCRATCH"),
        "points": points(SWEEP),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "seconds": {"rounds": [round(r, 3) for r in rounds], "median": round(
            statistics.median(rounds), 3), "max": round(max(rounds), 3)},
        "target_seconds": TARGET_S,
        "within_target": max(rounds) < TARGET_S,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"{record['points']} points: DAG built in "
          f"{record['seconds']['median']} s median, {record['seconds']['max']} s max "
          f"(target < {TARGET_S} s) -> {args.out}")
    return 0 if record["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
