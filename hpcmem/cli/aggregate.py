"""Validate result records and summarize them: one row per sweep point, medians over repeats.

RESULTS are JSONL files or folders searched for *.jsonl. Writes summary.parquet,
summary.csv, collectives_latency.csv, collectives_speedup.csv, train_step_time.csv,
rejected.csv (invalid lines, with file:line and the error), skipped.csv (failed and
skipped points, with reasons) and metadata.json into --out, each atomically.
Invalid, failed and skipped records are listed, never averaged in.

Exit status: 0 when the summary was written (invalid records are reported on
stderr, not fatal); 2 for bad input (a path that does not exist or cannot be
read, or no record at all).
"""

from __future__ import annotations

import argparse
import sys

from hpcmem.cli import bad_input

HELP = "summarize result records into summary.parquet and CSV tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem aggregate``."""
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="JSONL record files, or folders searched recursively for *.jsonl")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (created if missing)")


def run(args: argparse.Namespace) -> int:
    """Aggregate, then say on stderr what was left out."""
    from hpcmem.outputs import OutputPathError
    from hpcmem.results.aggregate import aggregate

    with bad_input(OutputPathError, where="--out"), \
            bad_input(FileNotFoundError, PermissionError, ValueError, where="RESULTS"):
        result = aggregate(args.results, args.out)
    loaded = result.loaded
    counts = result.metadata["records"]
    print(
        f"hpcmem aggregate: {len(result.summary)} points from {counts['ok']} ok records "
        f"in {len(loaded.files)} files -> {result.out_dir}/summary.parquet"
    )
    if loaded.rejected:
        print(
            f"hpcmem aggregate: warning: {len(loaded.rejected)} invalid records left out, "
            f"listed in {result.out_dir}/rejected.csv; first: "
            f"{loaded.rejected[0]['file']}:{loaded.rejected[0]['line']}: "
            f"{loaded.rejected[0]['error']}",
            file=sys.stderr,
        )
    if loaded.skipped:
        print(
            f"hpcmem aggregate: {counts['failed']} failed and {counts['skipped']} skipped "
            f"points left out, listed in {result.out_dir}/skipped.csv",
            file=sys.stderr,
        )
    return 0
