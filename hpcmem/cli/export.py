"""Write a run's figures where monitoring already looks: InfluxDB, Graylog, ReFrame
perflogs, an HTTP JSON endpoint, or CSV; or push them to the server (--to).

SUMMARY is an `hpcmem aggregate` output folder (or its summary.parquet). Every finite
figure of every point becomes one line, tagged with its system (cluster:partition, as
`hpcmem check` picks it: the Slurm partition the point ran in, or --system), benchmark,
point key and metric, and, with --verdict (the file of `hpcmem check --verdict-out` for
this run), its verdict and reference band:

  influx    InfluxDB line protocol (measurement hpcmem, field value)
  gelf      Graylog GELF 1.1 messages, one JSON document a line
  httpjson  ReFrame httpjson-style documents, one JSON object per point a line
  perflog   ReFrame-style performance log lines (fields separated by |)
  csv       one row per figure, a header first

Written to standard output, or atomically to --out, or pushed with --to URL:

  --format influx --to http://influx:8086 --database NAME    InfluxDB 1.x (/write); a
      database the server lacks is created where it allows it, else the error says how
  --format influx --to http://influx:8086 --org ORG --bucket NAME    InfluxDB 2.x
      (/api/v2/write)
  --format gelf --to http://graylog:12201/gelf    Graylog's GELF HTTP input
  --format httpjson --to URL    an HTTP JSON endpoint

A token is read from $HPCMEM_EXPORT_TOKEN, never from the command line: InfluxDB 2.x's
API token (Authorization: Token), or user:password for InfluxDB 1.x (basic auth). Every
request's answer is checked; the first refused one (or a server that cannot be reached)
stops the push: one line quoting the server and saying how many figures it had taken,
exit status 4.

A summary, verdict, option or --system that cannot be used (a corrupt file, a verdict of
another run) is one line naming it, exit 2, nothing written or pushed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from hpcmem.cli import UsageError, bad_input

if TYPE_CHECKING:
    from hpcmem.results.export.destination import Destination

HELP = ("write or push a run's figures as InfluxDB line protocol, GELF, ReFrame httpjson or "
        "perflog lines, or CSV")
FORMATS = ("influx", "gelf", "httpjson", "perflog", "csv")
#: the exit status of a push the server refused or that did not reach it
PUSH_FAILED = 4


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
    parser.add_argument("--to", metavar="URL",
                        help="push to this server instead (influx: its base URL; gelf, "
                             "httpjson: the endpoint); token in $HPCMEM_EXPORT_TOKEN")
    parser.add_argument("--database", metavar="NAME", help="InfluxDB 1.x: the database")
    parser.add_argument("--org", metavar="ORG", help="InfluxDB 2.x: the organization")
    parser.add_argument("--bucket", metavar="NAME", help="InfluxDB 2.x: the bucket")


def push_destination(args: argparse.Namespace) -> Destination:
    """Where ``--to`` pushes, every option checked (exit 2 naming the one at fault)."""
    from hpcmem.results.export.destination import TOKEN, destination

    if args.out:
        raise UsageError(f"--to: {args.to!r} and --out {args.out!r}: give one (--to pushes to "
                         "a server, --out writes a file)")
    return destination(args.to, args.format, database=args.database, org=args.org,
                       bucket=args.bucket, token=os.environ.get(TOKEN))


def run(args: argparse.Namespace) -> int:
    """Read the summary (and verdict), write its figures in the format asked for."""
    from hpcmem.errors import clip
    from hpcmem.outputs import OutputPathError, check_output_file, write_errors
    from hpcmem.record.jsonl import atomic_open
    from hpcmem.results.export.gelf import gelf_messages
    from hpcmem.results.export.httpjson import httpjson_lines
    from hpcmem.results.export.influx import influx_lines
    from hpcmem.results.export.perflog import perflog_lines
    from hpcmem.results.export.push import PushError, push
    from hpcmem.results.export.rows import ExportError, export_rows
    from hpcmem.results.export.table import csv_lines
    from hpcmem.results.summary import read_summary
    from hpcmem.results.systems import point_systems, requested_system
    from hpcmem.results.verdict import CheckError, VerdictError, read_verdict

    writers = {"influx": influx_lines, "gelf": gelf_messages, "httpjson": httpjson_lines,
               "perflog": perflog_lines, "csv": csv_lines}
    for option in ("database", "org", "bucket"):
        if getattr(args, option) is not None and not args.to:
            raise UsageError(f"--{option}: {getattr(args, option)!r} is a setting of --to, "
                             "which is not given")
    destination = push_destination(args) if args.to else None
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
    if destination is not None:
        try:
            done = push(destination, rows)
        except PushError as error:
            print(f"hpcmem export: error: --to: {clip(str(error), 1000)}", file=sys.stderr)
            return PUSH_FAILED
        print(f"hpcmem export: pushed {done}", file=sys.stderr)
        return 0
    text = "".join(f"{line}\n" for line in writers[args.format](rows))
    if args.out:
        with bad_input(OutputPathError, where="--out"), write_errors(args.out), \
                atomic_open(args.out) as handle:
            handle.write(text)
        print(f"hpcmem export: wrote {len(rows)} figures to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
