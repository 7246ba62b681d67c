"""Check a summary against reference figures and the run history (ReFrame-style).

Each figure, named <point key>/<metric> (for example
collectives/allreduce/hbw/float32/ranks=2/binding=none/size=8/latency_us.avg),
is compared with its reference [target, lower, upper, unit] for the
system:partition the point was measured in (its Slurm partition; --system for all
points; falling back to system:* and *:*), and with the median of the
last N runs in the history store (--history DIR; this run is appended after
checking, once per run_id, and only when the verdict could be written too).
Against the history a figure regresses only when it is beyond tolerance AND its
repeats differ significantly from the history's (Mann-Whitney U); a figure outside a
band that cannot be told from noise (repeats too spread, not significant, the node
shared its cores) is NOISY: listed, not a failure.
Prints the verdict table; with --table-out the table goes to that file and the
terminal gets a short summary (counts, failing, noisy and unjudged figures). --verdict-out
writes the verdict as JSON for `hpcmem report --verdict`.

A checked figure whose value is NaN, missing or not a number is UNJUDGED: counted and
listed, not a pass. A run in which no figure was judged at all (every checked figure
UNJUDGED, or none in the summary) is not a pass either: it exits 1, saying so, unless
--allow-unjudged.

Exit status: 0 when no figure regressed (NOISY and UNJUDGED ones included) and some figure
was judged, 1 on a regression (a figure out of bounds in either direction, a failed point,
an invalid record) or when nothing was judged (without --allow-unjudged), 2 on bad input
(references file, summary folder, options, a history store that cannot be read back, a
--verdict-out, --table-out or --history that cannot be written: checked before anything
is written). Quiet apart from the table: fit for cron and scrontab.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from hpcmem.cli import UsageError, bad_input
from hpcmem.results.history import MAX_LAST, HistoryError

if TYPE_CHECKING:
    from hpcmem.results.verdict import Row

HELP = "compare a summary with references and the run history; exit 1 on a regression"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem check``."""
    parser.add_argument("summary", metavar="SUMMARY",
                        help="an `hpcmem aggregate` output folder, or its summary.parquet")
    parser.add_argument("--references", required=True, metavar="FILE",
                        help="references YAML (format in config/references.yaml's header)")
    parser.add_argument("--history", metavar="DIR",
                        help="history store folder (history.sqlite; created if missing)")
    parser.add_argument("--last", type=int, metavar="N",
                        help=f"compare with the median of the last N runs, 1 to {MAX_LAST} "
                        "(default: the references file's history.last, else 5)")
    parser.add_argument("--system", metavar="NAME:PARTITION",
                        help="system and partition whose references apply to every point "
                        "(default: $HPCMEM_SYSTEM, else per point the Slurm cluster:partition "
                        "its records were measured in, else where the check runs: Slurm's "
                        "cluster:partition or HOST:default)")
    parser.add_argument("--verdict-out", metavar="FILE", help="write the verdict as JSON")
    parser.add_argument("--table-out", metavar="FILE",
                        help="write the full verdict table here and print a short summary")
    parser.add_argument("--no-append", action="store_true",
                        help="compare with the history but do not append this run to it")
    parser.add_argument("--allow-unjudged", action="store_true",
                        help="exit 0, not 1, when no figure could be judged (every checked "
                        "figure UNJUDGED: NaN, missing or not a number; or none at all)")


def run(args: argparse.Namespace) -> int:
    """Check, print the table, write the verdict; 1 on a regression."""
    from hpcmem.outputs import OutputPathError, check_output_dir, check_output_file
    from hpcmem.results.check import check, conclude
    from hpcmem.results.references import ReferencesError, load_references
    from hpcmem.results.summary import read_summary
    from hpcmem.results.systems import requested_system
    from hpcmem.results.verdict import (
        CheckError,
        format_table,
        summary_lines,
        verdict_document,
    )

    with bad_input(CheckError, where="--system"):
        system = requested_system(args.system)
    for option, path in (("--verdict-out", args.verdict_out), ("--table-out", args.table_out)):
        with bad_input(OutputPathError, where=option):
            if path:
                check_output_file(path)
    with bad_input(OutputPathError, where="--history"):
        if args.history:
            check_output_dir(args.history)
    with bad_input(ReferencesError, where="--references"):
        references = load_references(args.references)
    with bad_input(FileNotFoundError, ValueError, where="SUMMARY"):
        summary = read_summary(args.summary)
    with _history_errors(args.history):
        with bad_input(CheckError, where="--last"):
            result = check(summary, references, system, history_folder=args.history,
                           last=args.last)
        with bad_input(OutputPathError, where="--verdict-out or --table-out"):
            conclude(result, summary, append=not args.no_append, verdict_out=args.verdict_out,
                     references_path=args.references, table_out=args.table_out)
    if args.table_out:
        document = verdict_document(result, args.references)
        print("\n".join(summary_lines(document, table=args.table_out)), flush=True)
    else:
        print(format_table(result), flush=True)
    if result.verdict == "UNJUDGED" and not args.allow_unjudged:
        print(f"hpcmem check: error: nothing judged: {_unjudged_why(result.rows)}; "
              "--allow-unjudged accepts such a run", file=sys.stderr)
        return 1
    return 1 if result.verdict == "FAIL" else 0


def _unjudged_why(rows: list[Row]) -> str:
    """Why a run judged nothing, from its verdict rows."""
    from hpcmem.results.virtual import is_vm_system

    unjudged = [row for row in rows if row.verdict == "UNJUDGED"]
    if not unjudged:
        return "the summary has no checked figure"
    virtual = sum(is_vm_system(row.system) for row in unjudged)
    if virtual == len(unjudged):
        return (f"the summary's {virtual} checked figures were all measured in virtual "
                "machines, which nothing judges")
    return (f"none of the summary's {len(unjudged)} checked figures has a usable value (NaN, "
            "missing or not a number)"
            + (f"; {virtual} of them were measured in virtual machines" if virtual else ""))


@contextmanager
def _history_errors(folder: str | None) -> Iterator[None]:
    """A history store that cannot be read or written is bad input (exit 2), naming it."""
    try:
        yield
    except HistoryError as error:
        raise UsageError(f"--history: {error}") from None
    except (sqlite3.Error, OSError) as error:
        raise UsageError(f"--history: {folder}: not a usable history store ({error})") from None
