"""Write a run's figures where monitoring already looks: InfluxDB, Graylog, ReFrame
perflogs, or CSV.

SUMMARY is an `hpcmem aggregate` output folder (or its summary.parquet). Every finite
figure of every point becomes one line, tagged with its system (cluster:partition, as
`hpcmem check` picks it: the Slurm partition the point ran in, or --system), benchmark,
point key and metric, and, with --verdict (the file of `hpcmem check --verdict-out` for
this run), its verdict and reference band:

  influx   InfluxDB line protocol (measurement hpcmem, field value): POST it to
           /write?db=NAME (1.x) or /api/v2/write (2.x)
  gelf     Graylog GELF 1.1 messages, one JSON document a line
  perflog  ReFrame-style performance log lines (fields separated by |)
  csv      one row per figure, a header first

Written to standard output, or atomically to --out. A summary, verdict or --system that
cannot be used (a corrupt file, a verdict of another run) is one line naming it, exit 2,
nothing written.
"""

from __future__ import annotations

import argparse
import sys

from hpcmem.cli import bad_input

HELP = "write a run's figures as InfluxDB line protocol, GELF, ReFrame perflog lines or CSV"
FORMATS = ("influx", "gelf", "perflog", "csv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem export``."""
    parser.add_argument("summary", metavar="SUMMARY",
                        help="an `hpcmem aggregate` output folder, or its summary.parquet")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--verdict", metavar="FILE",
                        help="this run's verdict (`hpcmem check --verdict-out`): tags each "
                             "figure with its verdict and reference")
    parser.add_argument("--system", metavar="NAME:PARTITION",
                        help="the system of every point (default: the partition each ran "
                             "in, else $HPCMEM_SYSTEM or where this runs)")
    parser.add_argument("--out", metavar="FILE", help="write here (default: standard output)")


def run(args: argparse.Namespace) -> int:
    """Read the summary (and verdict), write its figures in the format asked for."""
    from hpcmem.outputs import OutputPathError, check_output_file, write_errors
    from hpcmem.record.jsonl import atomic_open
    from hpcmem.results.export.gelf import gelf_messages
    from hpcmem.results.export.influx import influx_lines
    from hpcmem.results.export.perflog import perflog_lines
    from hpcmem.results.export.rows import ExportError, export_rows
    from hpcmem.results.export.table import csv_lines
    from hpcmem.results.summary import read_summary
    from hpcmem.results.systems import point_systems, requested_system
    from hpcmem.results.verdict import CheckError, VerdictError, read_verdict

    writers = {"influx": influx_lines, "gelf": gelf_messages, "perflog": perflog_lines,
               "csv": csv_lines}
    with bad_input(CheckError, where="--system"):
        system = requested_system(args.system)
    with bad_input(OutputPathError, where="--out"):
        if args.out:
            check_output_file(args.out)
    with bad_input(VerdictError, where="--verdict"):
        verdict = read_verdict(args.verdict) if args.verdict else None
    with bad_input(FileNotFoundError, ValueError, where="SUMMARY"):
        summary = read_summary(args.summary)
    with bad_input(ExportError):
        rows = list(export_rows(summary, point_systems(summary, system), verdict))
    text = "".join(f"{line}\n" for line in writers[args.format](rows))
    if args.out:
        with bad_input(OutputPathError, where="--out"), write_errors(args.out), \
                atomic_open(args.out) as handle:
            handle.write(text)
        print(f"hpcmem export: wrote {len(rows)} figures to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
