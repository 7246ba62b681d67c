"""OSU's C collectives against ``hpcmem collectives`` (both timing loops), side by side.

Run ``python benchmarks/osu_comparison.py --osu-dir DIR`` with DIR an installed OSU
Micro-Benchmarks 7.x (its prefix, e.g. from Spack or a module, or the folder holding
``osu_allreduce``). In each of ``--rounds`` rounds it runs, in alternating order, OSU's
``osu_allreduce``, ``osu_bcast`` and ``osu_gather`` (``-m 8:<max> -f -T mpi_float``) and
one ``hpcmem collectives`` run of the same ops and sizes on NumPy float32 buffers, which times
every point with the mpi4py loop and the native C loop; every run is
``mpirun -n 2 --bind-to core --map-by core``. The table holds medians over rounds and goes to
``benchmarks/results/osu_comparison-<date>.json`` and ``.md`` (``--out-dir``) with the
date, machine, commit and exact command; ``hpcmem report --osu FILE`` shows it. Exit 0 when
every target is met, 1 when one is missed, 2 for bad input (a --osu-dir without OSU's
binaries is named in one line).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import header_lines, run_facts, shown, write_result

from hpcmem.collectives import comparison
from hpcmem.record.jsonl import read_records
from hpcmem.units import UnitError, format_size, parse_size

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MPIRUN = ("mpirun", "-n", "2", "--bind-to", "core", "--map-by", "core")
MIN_SIZE = 8
MIN_ROUNDS_FINAL = 15  # fewer rounds are labelled a trial in the table


def _run(command: list[str]) -> str:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def osu_round(binaries: dict[str, Path], max_size: int) -> tuple[str | None, dict]:
    """One run of each OSU binary: its version and ``op -> size -> us``."""
    version, figures = None, {}
    for op, binary in binaries.items():
        text = _run([*MPIRUN, str(binary), "-m", f"{MIN_SIZE}:{max_size}", "-f",
                     "-T", "mpi_float"])
        version, figures[op] = comparison.osu_latencies(text)
    return version, figures


def hpcmem_round(max_size: int, scratch: Path) -> tuple[dict, dict]:
    """One ``hpcmem collectives`` run: ``op -> size -> us`` of the mpi4py and native loops."""
    output = scratch / "round.jsonl"
    hpcmem = str(Path(sys.executable).parent / "hpcmem")
    _run([*MPIRUN, hpcmem, "collectives", "--op", ",".join(comparison.COMPARED_OPS),
          "--buffer", "numpy", "--dtype", "float32", "--min-size", str(MIN_SIZE),
          "--max-size", str(max_size), "--output", str(output)])
    loops: tuple[dict, dict] = ({}, {})
    for record in read_records(output):
        if record["status"] != "ok" or "native_latency_us" not in record:
            raise RuntimeError(f"hpcmem collectives: {record['op']} {record['size_bytes']} B "
                               f"is {record['status']} without native figures: "
                               f"{record.get('reason') or record.get('native_unavailable')}")
        size = record["size_bytes"]
        loops[0].setdefault(record["op"], {})[size] = record["latency_us"]["avg"]
        loops[1].setdefault(record["op"], {})[size] = record["native_latency_us"]["avg"]
    return loops


def markdown(result: dict) -> str:
    """The .md file: date, machine, command, method, the table, the targets."""
    trial = "" if result["rounds"] >= MIN_ROUNDS_FINAL else (
        f" — trial: fewer than {MIN_ROUNDS_FINAL} rounds")
    return "\n".join([
        f"# OSU C against hpcmem collectives ({result['date']}){trial}",
        "",
        *header_lines(result),
        f"- OSU Micro-Benchmarks {result['osu']['version']} ({result['osu']['dir']})",
        f"- Method: {result['rounds']} round(s), OSU first in even rounds and hpcmem first in odd "
        f"ones; each run `{shlex.join(MPIRUN)} ...`: OSU `osu_<op> -m "
        f"{MIN_SIZE}:{result['max_size']} -f -T mpi_float`, hpcmem `hpcmem collectives --op "
        f"{','.join(comparison.COMPARED_OPS)} --buffer numpy --dtype float32` (thread level "
        "single, page-aligned buffers; every point timed by the mpi4py loop and then the "
        "native C loop). Figures are medians over rounds of the average latency across ranks; "
        "Python overhead is the median over rounds of mpi4py minus native from the same run.",
        "",
        comparison.markdown_table(result["rows"]),
        "",
        comparison.targets_line(result["rows"]),
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--osu-dir", required=True, metavar="DIR",
                        help="an OSU Micro-Benchmarks 7.x install (prefix or binaries' folder)")
    parser.add_argument("--rounds", type=int, default=31,
                        help=f"alternating rounds (default 31; below {MIN_ROUNDS_FINAL}: a trial)")
    parser.add_argument("--max-size", default="1M", metavar="SIZE",
                        help="largest message (default 1M)")
    parser.add_argument("--out-dir", default=str(RESULTS), metavar="DIR",
                        help="where the .json and .md go (default benchmarks/results)")
    args = parser.parse_args()
    try:
        binaries = comparison.find_binaries(args.osu_dir)
        max_size = parse_size(args.max_size)
    except (comparison.OsuDirError, UnitError) as error:
        prefix = "" if str(error).startswith("--") else "--max-size: "
        print(f"osu_comparison.py: error: {prefix}{error}", file=sys.stderr)
        return 2
    if args.rounds < 1 or max_size < MIN_SIZE:
        print(f"osu_comparison.py: error: --rounds {args.rounds} / --max-size "
              f"{args.max_size}: need at least 1 round and {MIN_SIZE} bytes", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    rounds, version = [], None
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(args.rounds):
            steps = ["osu", "hpcmem"] if number % 2 == 0 else ["hpcmem", "osu"]
            figures: dict = {}
            for step in steps:
                if step == "osu":
                    version, figures["osu"] = osu_round(binaries, max_size)
                else:
                    figures["mpi4py"], figures["native"] = hpcmem_round(max_size, Path(scratch))
            rounds.append(figures)
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    result = {
        **run_facts("benchmarks/osu_comparison.py", load_before),
        "rounds": args.rounds,
        "max_size": max_size,
        "osu": {"dir": shown(str(Path(args.osu_dir).resolve())), "version": version},
        "rows": comparison.summarise(rounds),
    }
    stem = write_result(args.out_dir, "osu_comparison", result, markdown(result))
    print(markdown(result))
    print(f"wrote {stem}.json and .md ({format_size(max_size)} largest message)", file=sys.stderr)
    return 0 if all(all(row["targets"].values()) for row in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
