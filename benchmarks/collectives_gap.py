"""Where the gap between mpi4py collectives and OSU C comes from, one cause at a time.

Run ``python benchmarks/collectives_gap.py`` (2 ranks, ``mpirun -n 2 --bind-to core
--map-by core``). It times Allreduce, Bcast and Gather at 8 B, 4 KiB, 64 KiB and 1 MiB
(float32) in steps, each removing one cause of the gap; every step is timed in the same
process as the next, in rotating order, and MPI's thread level, fixed at start-up, alternates
between launches (``--launches`` of each):

- A: mpi4py's default thread level (``multiple``), NumPy's own arrays (16 bytes past a page
  boundary), the arrays passed as they are: what hpcmem ran before;
- B: thread level ``single`` (what OSU's MPI_Init gets);
- C: page-aligned buffers (as OSU's posix_memalign);
- D: prebound ``[array, datatype]`` messages: hpcmem's mpi4py loop now;
- E: the native C loop called once per iteration from Python (only Python between calls);
- F: the native C loop, all iterations in C (OSU's loop on the same buffers);
- G: F at thread level ``multiple``: the thread level's cost in C alone.

The figure per step is the median over all rounds of the average latency across ranks.
Results go to ``benchmarks/results/collectives_gap-<date>.{json,md}`` (``--out-dir``) with the
date, machine, commit and exact command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import header_lines, run_facts, write_result

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
OPS = ("allreduce", "bcast", "gather")
SIZES = (8, 4 << 10, 64 << 10, 1 << 20)
STEPS = {
    "A": "thread level multiple, NumPy arrays, passed as they are",
    "B": "thread level single",
    "C": "page-aligned buffers",
    "D": "[array, datatype] messages (hpcmem's mpi4py loop)",
    "E": "native C call per iteration, Python between calls",
    "F": "native C loop (OSU's loop, same buffers)",
    "G": "F at thread level multiple",
}
MPIRUN = ("mpirun", "-n", "2", "--bind-to", "core", "--map-by", "core")


def worker(level: str, rounds: int, out: Path) -> None:
    """Inside mpirun at thread level ``level``: every step of that level, ``rounds`` times."""
    from contextlib import ExitStack

    import numpy as np
    from mpi4py import MPI

    from hpcmem.collectives import OPS as REGISTRY
    from hpcmem.collectives import buffers, native, timing
    from hpcmem.collectives.sizes import osu_counts

    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    steps = ("A", "G") if level == "multiple" else ("B", "C", "D", "E", "F")
    samples: dict[str, list[float]] = {}
    with ExitStack() as stack:
        largest = max(SIZES) // 4
        own = {"send": np.ones(ranks * largest, np.float32),
               "recv": np.zeros(ranks * largest, np.float32)}
        aligned = {"send": buffers.allocate("numpy", ranks * largest, np.float32, stack),
                   "recv": buffers.allocate("numpy", ranks * largest, np.float32, stack)}
        aligned["send"][:], aligned["recv"][:] = 1, 0
        for number in range(rounds):
            for name in OPS:
                op = REGISTRY[name]
                for size in SIZES:
                    count = size // 4
                    iterations, warmup = osu_counts(size, None, None)
                    send_len, recv_len = op.layout(count, ranks, rank, 0)
                    order = steps[number % len(steps):] + steps[:number % len(steps)]
                    for step in order:
                        memory = own if step in "AB" else aligned
                        send = None if send_len is None else memory["send"][:send_len]
                        recv = None if recv_len is None else memory["recv"][:recv_len]
                        if step in "ABC":
                            call = op.bind(comm, send, recv, count, ranks, 0, MPI)
                        else:
                            call = op.prepare(comm, send, recv, count, ranks, 0, MPI)
                        if step in "ABCD":
                            seconds = timing.rank_latency(comm, call, iterations, warmup)
                        elif step == "E":
                            native.rank_latency(comm, op, send, recv, count, 0, warmup, 0)
                            seconds = statistics.fmean(
                                native.rank_latency(comm, op, send, recv, count, 0, 1, 0)
                                for _ in range(iterations))
                        else:
                            seconds = native.rank_latency(comm, op, send, recv, count, 0,
                                                          iterations, warmup)
                        average = timing.across_ranks(comm, seconds).avg
                        samples.setdefault(f"{step}|{name}|{size}", []).append(average)
    if rank == 0:
        out.write_text(json.dumps(samples))


def markdown(result: dict) -> str:
    """The .md file: how it was run and the steps' medians with what each step removed."""
    lines = [
        f"# Where the gap to OSU C comes from ({result['date']})",
        "",
        *header_lines(result),
        f"- Method: {result['launches']} launches per thread level, alternating, each "
        f"`{shlex.join(MPIRUN)}` with {result['rounds']} rounds; steps in rotating order "
        "within a launch; OSU's iteration counts; medians over all rounds (us).",
        "",
        *[f"- {step}: {text}" for step, text in STEPS.items()],
        "",
        "| op | size (B) | " + " | ".join(STEPS) + " | A-B thread level | B-C alignment | "
        "C-D messages | D-E per-call Python | E-F Python between calls | G-F thread level "
        "in C |",
        "|---|---:|" + "---:|" * (len(STEPS) + 6),
    ]
    for row in result["rows"]:
        us = row["us"]
        gaps = [us["A"] - us["B"], us["B"] - us["C"], us["C"] - us["D"], us["D"] - us["E"],
                us["E"] - us["F"], us["G"] - us["F"]]
        lines.append(f"| {row['op']} | {row['size_bytes']} | "
                     + " | ".join(f"{us[s]:.2f}" for s in STEPS) + " | "
                     + " | ".join(f"{gap:+.2f}" for gap in gaps) + " |")
    return "\n".join([*lines, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4, help="launches per thread level")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per launch")
    parser.add_argument("--out-dir", default=str(RESULTS), metavar="DIR")
    parser.add_argument("--worker", nargs=2, metavar=("LEVEL", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.rounds, Path(args.worker[1]))
        return 0
    if args.launches < 1 or args.rounds < 1:
        parser.error("--launches and --rounds: need at least 1")
    load_before = os.getloadavg()[0]
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for launch in range(args.launches):
            levels = ("single", "multiple") if launch % 2 == 0 else ("multiple", "single")
            for level in levels:
                raw = Path(scratch) / "raw.json"
                env = {**os.environ, "MPI4PY_RC_THREAD_LEVEL": level,
                       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
                subprocess.run([*MPIRUN, "-x", "MPI4PY_RC_THREAD_LEVEL", sys.executable,
                                str(Path(__file__).resolve()), "--rounds", str(args.rounds),
                                "--worker", level, str(raw)], env=env, check=True, cwd=REPO)
                for key, values in json.loads(raw.read_text()).items():
                    samples.setdefault(key, []).extend(values)
    result = {
        **run_facts("benchmarks/collectives_gap.py", load_before),
        "launches": args.launches,
        "rounds": args.rounds,
        "rows": [{"op": op, "size_bytes": size,
                  "us": {s: statistics.median(samples[f"{s}|{op}|{size}"]) for s in STEPS}}
                 for op in OPS for size in SIZES],
    }
    write_result(args.out_dir, "collectives_gap", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
