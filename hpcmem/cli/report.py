"""Render an aggregated summary as one self-contained HTML page with embedded plots.

SUMMARY is an `hpcmem aggregate` output folder (or its summary.parquet). The page
shows latency and bus bandwidth against message size per op and buffer kind,
the speedup over NumPy buffers, training step time per memory policy with its
spread, where the summary holds peers (benchmarks/gpu/hf_offload.py's records aggregated
with the others) each tool's step time against the GPU memory it held and their tables,
the failed and skipped points with reasons, the machine metadata, and,
with --verdict, the result of `hpcmem check --verdict-out` and, when that check kept a
history, each judged figure over its last runs (read from that history store); with
--native, the same points run natively against the container (overhead per op and size);
with --osu, the side-by-side table of OSU's C collectives and hpcmem's
(benchmarks/osu_comparison.py); with --slurm-jobs, every Slurm job of the run (as the
workflow submitted them) with its points and what sacct says of it now: partition,
account, QOS, state, elapsed time and exit code. Written atomically.
"""

from __future__ import annotations

import argparse
import sqlite3

from hpcmem.cli import bad_input

HELP = "render a summary as a self-contained HTML report with plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem report``."""
    parser.add_argument("summary", metavar="SUMMARY",
                        help="an `hpcmem aggregate` output folder, or its summary.parquet")
    parser.add_argument("--out", required=True, metavar="FILE", help="the HTML file to write")
    parser.add_argument("--verdict", metavar="FILE",
                        help="verdict JSON written by `hpcmem check --verdict-out`")
    parser.add_argument("--native", metavar="SUMMARY",
                        help="a summary of the same points run natively: adds the "
                             "native-against-container section")
    parser.add_argument("--osu", metavar="FILE",
                        help="an OSU comparison (.json from benchmarks/osu_comparison.py): "
                             "adds the against-OSU-C section")
    parser.add_argument("--slurm-jobs", metavar="FILE",
                        help="the run's Slurm jobs as the workflow writes them "
                             "(RUN/logs/slurm_jobs.jsonl; missing: the run submitted none): "
                             "adds their table, with sacct's state of each, to the run "
                             "section")


def run(args: argparse.Namespace) -> int:
    """Read the summary (and verdict) and write the report."""
    from hpcmem.collectives.comparison import html_section, read_comparison
    from hpcmem.draw.html import section
    from hpcmem.errors import BadInputError
    from hpcmem.outputs import OutputPathError, check_output_file
    from hpcmem.results.history import HistoryError
    from hpcmem.results.history_section import history_section, verdict_timelines
    from hpcmem.results.report import write_report
    from hpcmem.results.summary import read_summary
    from hpcmem.results.verdict import VerdictError, read_verdict
    from hpcmem.slurm.job_table import jobs_html
    from hpcmem.slurm.journal import read_journal

    with bad_input(OutputPathError, where="--out"):
        check_output_file(args.out)
    with bad_input(VerdictError, where="--verdict"):
        verdict = read_verdict(args.verdict) if args.verdict else None
    with bad_input(VerdictError, HistoryError, sqlite3.Error, OSError, where="--verdict"):
        timelines = verdict_timelines(verdict) if verdict else None
    with bad_input(FileNotFoundError, ValueError, where="SUMMARY"):
        summary = read_summary(args.summary)
    with bad_input(FileNotFoundError, ValueError, where="--native"):
        native = read_summary(args.native) if args.native else None
    with bad_input(FileNotFoundError, ValueError, where="--osu"):
        osu = read_comparison(args.osu) if args.osu else None
    with bad_input(BadInputError, where="--slurm-jobs"):
        submitted = read_journal(args.slurm_jobs) if args.slurm_jobs else None
    jobs = None if submitted is None else jobs_html(
        submitted, [str(job) for job in summary.metadata.get("slurm_job_ids") or []])
    extra = [section("History", history_section(verdict, timelines), anchor="history")
             ] if verdict and timelines is not None else []
    extra += [section("Against OSU C", html_section(osu), anchor="osu")] if osu else []
    with bad_input(OutputPathError, where="--out"):
        write_report(args.out, summary, verdict, native, extra, jobs)
    print(f"hpcmem report: wrote {args.out}")
    return 0
