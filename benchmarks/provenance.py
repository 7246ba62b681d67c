"""What every result file under benchmarks/results/ records about its run, and writing it.

``run_facts`` gives the date, exact command, commit, load average and machine;
``header_lines`` the Markdown lines that state them; ``write_result`` the dated ``.json``
and ``.md`` pair. ``shown`` writes a path the way records name it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """A subset of ``hpcmem info --json`` plus the CPU model and kernel."""
    info = json.loads(
        subprocess.run(
            [str(Path(sys.executable).parent / "hpcmem"), "info", "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "host": info["host"],
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "numa_nodes": [
            {"id": n["id"], "cpus": n["cpus"], "memory_total_bytes": n["memory_total_bytes"]}
            for n in info["numa_nodes"]
        ],
        "hbw": info["hbw"],
        "hbw_backend": info["hbw_backend"],
        "mpi": info["mpi"],
        "python": platform.python_version(),
    }


def commit() -> str:
    """HEAD, with ``-dirty`` when the tree has uncommitted changes."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=REPO).stdout

    dirty = "-dirty" if git("status", "--porcelain").strip() else ""
    return git("rev-parse", "--short", "HEAD").strip() + dirty


def shown(text: str) -> str:
    """``text`` naming no folder of the machine it ran on: paths in this checkout relative to
    it (the checkout itself as ``.``), under the temporary and the home folder as ``<tmp>/...``
    and ``~/...``. Any other path (a site's install prefix) is kept."""
    text = text.replace(f"{REPO}/", "")
    for place, name in ((REPO, "."), (Path(tempfile.gettempdir()), "<tmp>"), (Path.home(), "~")):
        text = re.sub(rf"{re.escape(str(place))}(?![\w.-])", name, text)
    return text


def run_facts(script: str, load_before: float) -> dict:
    """Date, the exact command (``python <script> <argv>``, paths ``shown``), commit, load and
    machine."""
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shown(shlex.join(["python", script, *sys.argv[1:]])),
        "commit": commit(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "machine": machine(),
    }


def header_lines(result: dict) -> list[str]:
    """The Markdown lines stating the command, commit, machine, MPI and load of ``result``."""
    m = result["machine"]
    load = result["load_average_1min"]
    return [
        f"- Command: `{result['command']}`; commit {result['commit']}",
        f"- Machine: {m['host']}, {m['cpu']}, {m['cpus']} CPUs, kernel {m['kernel']}",
        f"- MPI: {m['mpi']['library']}; mpi4py {m['mpi']['mpi4py']}; Python {m['python']}",
        f"- Load average (1 min) before/after: {load['before']:.2f} / {load['after']:.2f}",
    ]


def write_result(out_dir: str | os.PathLike, name: str, result: dict, text: str) -> Path:
    """``<out_dir>/<name>-<date>.json`` and ``.md``; returns the path without suffix."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}-{result['date'][:10]}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    return stem
