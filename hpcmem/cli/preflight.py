"""Check a Slurm profile and sweep against the cluster before anything is submitted.

Builds the jobs of `snakemake --profile PROFILE [--configfile FILE...]` (every rule of the
sweep) and checks each with sinfo, scontrol and sacctmgr: its partition, account and QOS
exist and are the user's to use, and its CPUs, memory, GPUs, time limit and constraint fit
a node of its partition. The workflow runs the same preflight itself before its first
submission. Run it from the checkout, or from a folder without a workflow of its own
(then it checks the checkout hpcmem runs from), or give --snakefile and --directory. A profile
name (hpcmem-site, as docs/slurm-site.md copies it) is looked up in Snakemake's config
folders first and the current folder last, so a folder of the same name where you run it
(the checkout's package hpcmem/) is not taken for it; when the name is a folder in more
than one place, a note names each and the one taken.

Prints one line per problem, naming the setting, its value, the rules using it and what
the cluster accepts. Exit status: 0 every job can start; 2 a problem, a profile or sweep
file that is not a YAML mapping without aliases (named at once), or a profile or
configuration snakemake rejects (what it said is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpcmem.cli import UsageError

HELP = "check a Slurm profile's partitions, accounts, QOS and job sizes against the cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem preflight``: those of the snakemake run it precedes."""
    parser.add_argument("--profile", metavar="PROFILE",
                        help="the site profile (default $SNAKEMAKE_PROFILE): a folder, or a "
                             "name looked up in ~/.config/snakemake, /etc/xdg/snakemake, then "
                             "the current folder")
    parser.add_argument("--configfile", nargs="+", metavar="FILE",
                        help="sweep configuration files, as for snakemake")
    parser.add_argument("--config", nargs="+", metavar="KEY=VALUE",
                        help="configuration values, as for snakemake")
    parser.add_argument("--snakefile", metavar="FILE",
                        help="the workflow (default: snakemake's, else, where the current "
                             "folder holds none, the checkout hpcmem runs from)")
    parser.add_argument("--directory", metavar="DIR",
                        help="working directory of the run (default: the current folder, "
                             "or that checkout with its workflow)")


def checkout_workflow() -> Path | None:
    """The Snakefile of the checkout this hpcmem runs from, if it runs from one."""
    snakefile = Path(__file__).resolve().parents[2] / "workflow" / "Snakefile"
    return snakefile if snakefile.is_file() else None


def snakemake_arguments(args: argparse.Namespace) -> list[str]:
    """The snakemake command line the options stand for."""
    words: list[str] = []
    for option in ("profile", "snakefile", "directory"):
        if getattr(args, option):
            words += [f"--{option}", getattr(args, option)]
    for option in ("configfile", "config"):
        if getattr(args, option):
            words += [f"--{option}", *getattr(args, option)]
    return words


def run(args: argparse.Namespace) -> int:
    """Run the preflight; print its problems (exit 2) or what it checked (exit 0)."""
    from snakemake.common import SNAKEFILE_CHOICES

    from hpcmem.workflow.config import check_profile
    from hpcmem.workflow.preflight import WorkflowStoppedError, run_preflight

    choice = check_profile(args.profile or os.environ.get("SNAKEMAKE_PROFILE"),
                           args.configfile)
    if choice is not None:
        if choice.note:
            print(f"hpcmem preflight: note: {choice.note}", file=sys.stderr)
        args.profile = str(choice.folder)
    own = args.snakefile or any(Path(name).is_file() for name in SNAKEFILE_CHOICES)
    if not own and (snakefile := checkout_workflow()) is not None:
        args.snakefile = str(snakefile)
        args.directory = args.directory or str(snakefile.parents[1])
    try:
        result = run_preflight(snakemake_arguments(args))
    except WorkflowStoppedError as error:
        raise UsageError(str(error)) from None
    for line in result.problems:
        print(f"hpcmem preflight: {line}")
    if result.problems:
        print(f"hpcmem preflight: {len(result.problems)} problem(s): fix them before submitting")
        return 2
    print(f"hpcmem preflight: ok: {result.summary}")
    return 0
