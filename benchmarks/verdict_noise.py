"""Does the regression check cry wolf on a busy node, and does it still catch a slowdown?

For each condition (``quiet``: nothing started beside the runs; ``busy``: one busy-loop
process per CPU for the whole condition) it runs a small sweep (``hpcmem collectives``
under ``mpirun -n 2``: allreduce and bcast on numpy buffers, 8 to 64 B, 5 repeats) and
checks every run with ``hpcmem check`` against ``config/references.yaml`` and a history of
its own, as the nightly does:

1. ``--clean`` identical runs, each checked and appended to the history: none may FAIL
   (NOISY figures are allowed and counted);
2. ``--injected`` runs with a real slowdown (``HPCMEM_TEST_SLOWDOWN``, spinning inside
   the timed region of every allreduce call), each checked against that history without being
   appended: every one must FAIL, and only on allreduce figures.

Prints one line per run and a JSON document (``--out`` writes it too, with the date, the
machine, the commit and the exact command); exit 0 when both hold in every condition, 1
when not. ``tests/test_verdict_mpi.py`` runs it small; the committed result
(``benchmarks/results/verdict_noise-<date>.json``) is the full 10 + 10 per condition.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provenance import shown

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SWEEP = ["--op", "allreduce,bcast", "--buffer", "numpy", "--min-size", "8", "--max-size", "64",
         "--warmup", "20"]
CONDITIONS = ("quiet", "busy")


@contextlib.contextmanager
def background_load(condition: str) -> Iterator[None]:
    """One busy-loop process per CPU while the block runs (``busy``), else nothing."""
    hogs = []
    if condition == "busy":
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def sweep(folder: Path, run_id: str, args: argparse.Namespace, slowdown: str | None) -> Path:
    """One run of the sweep under ``mpirun -n 2``; the folder of its aggregated summary."""
    from hpcmem.cli import main

    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "HPCMEM_RUN_ID": run_id, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("HPCMEM_TEST_SLOWDOWN", None)
    if slowdown:
        env["HPCMEM_TEST_SLOWDOWN"] = slowdown
    records = folder / run_id / "records.jsonl"
    subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2",
                    str(BIN / "hpcmem"), "collectives", *sweep_options(args),
                    "--output", str(records)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    with contextlib.redirect_stdout(io.StringIO()):
        main(["aggregate", str(records), "--out", str(folder / run_id / "summary")])
    return folder / run_id / "summary"


def sweep_options(args: argparse.Namespace) -> list[str]:
    """The ``hpcmem collectives`` options of every run."""
    return [*SWEEP, "--iterations", str(args.iterations), "--repeats", str(args.repeats)]


def check(summary: Path, history: Path, references: Path, append: bool) -> dict[str, Any]:
    """``hpcmem check`` of one run; its verdict document."""
    from hpcmem.cli import main

    verdict = summary.parent / "verdict.json"
    argv = ["check", str(summary), "--references", str(references), "--history", str(history),
            "--system", "verdict-noise:local", "--verdict-out", str(verdict)]
    with contextlib.redirect_stdout(io.StringIO()):
        main([*argv, *([] if append else ["--no-append"])])
    return json.loads(verdict.read_text())


def judged(verdict: dict[str, Any]) -> dict[str, Any]:
    """What one run's verdict says: counts, and the failed and noisy figures with notes."""
    def notes(kind: str) -> dict[str, str]:
        return {f["figure"]: f["note"] for f in verdict["figures"] if f["verdict"] == kind}

    return {"verdict": verdict["verdict"], "counts": verdict["counts"], "failed": notes("FAIL"),
            "noisy": notes("NOISY")}


def condition_runs(condition: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The clean and injected runs of one condition, each judged."""
    history = work / condition / "history"
    clean, injected = [], []
    with background_load(condition):
        for index in range(args.clean):
            summary = sweep(work / condition, f"clean{index}", args, None)
            clean.append(judged(check(summary, history, args.references, append=True)))
            print(f"{condition} clean {index}: {clean[-1]['counts']}", flush=True)
        for index in range(args.injected):
            summary = sweep(work / condition, f"injected{index}", args, args.slowdown)
            injected.append(judged(check(summary, history, args.references, append=False)))
            print(f"{condition} injected {index}: {injected[-1]['counts']}", flush=True)
    op = args.slowdown.split(":")[0]
    return {
        "clean": clean,
        "injected": injected,
        "clean_runs_failed": sum(run["verdict"] == "FAIL" for run in clean),
        "injected_runs_caught": sum(run["verdict"] == "FAIL" for run in injected),
        "failures_outside_the_slowed_op": sorted(
            {f for run in injected for f in run["failed"] if f"/{op}/" not in f}),
    }


def machine() -> dict[str, Any]:
    """Where it ran: host, CPUs, kernel, Python, the commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "commit": commit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", type=int, default=10, help="clean runs per condition")
    parser.add_argument("--injected", type=int, default=10, help="slowed runs per condition")
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help="comma list of quiet, busy")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per point")
    parser.add_argument("--iterations", type=int, default=200, help="timed calls per repeat")
    parser.add_argument("--slowdown", default="allreduce:300",
                        help="HPCMEM_TEST_SLOWDOWN of the injected runs (OP:MICROSECONDS)")
    parser.add_argument("--references", type=Path, default=REPO / "config" / "references.yaml")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the load on the way out
    conditions = args.conditions.split(",")
    if set(conditions) - set(CONDITIONS) or args.clean < 1 or args.injected < 1:
        parser.error("--conditions: quiet, busy; --clean and --injected: at least 1")
    where = machine()  # the commit measured: read before the runs
    work = Path(tempfile.mkdtemp(prefix="verdict-noise-"))
    try:
        results = {c: condition_runs(c, args, work) for c in conditions}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    held = all(r["clean_runs_failed"] == 0 and r["injected_runs_caught"] == args.injected
               and not r["failures_outside_the_slowed_op"] for r in results.values())
    document = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shown(shlex.join(["python", "benchmarks/verdict_noise.py",
                                     *(argv or sys.argv[1:])])),
        "machine": where,
        "sweep": sweep_options(args),
        "slowdown": args.slowdown,
        "held": held,
        "conditions": results,
    }
    text = json.dumps(document, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
