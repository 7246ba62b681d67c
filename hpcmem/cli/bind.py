"""Run a command under the numactl binding of this MPI rank.

    hpcmem bind [--local-rank N] [--skip-unavailable] [--name NAME] BINDING -- COMMAND [ARGS...]
    srun -n 4 hpcmem bind hbw -- hpcmem collectives --op allreduce --buffer hbw
    srun -n 4 hpcmem bind --name node0 -- "--cpunodebind=0 --membind=0" -- hpcmem collectives

BINDING is none, cores, hbw, dram, interleave, or explicit numactl arguments as one
word ("--cpunodebind=0 --membind=4"; put `--` before a binding of one option:
`hpcmem bind -- --membind=4 -- COMMAND`). The local rank comes from the launcher
(OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, PALS_LOCAL_RANKID,
MV2_COMM_WORLD_LOCAL_RANK, FLUX_TASK_LOCAL_ID; else PMIX_RANK, global, right on one
node only) unless --local-rank is given; a rank is ASCII digits, anything else exits 2.
The command is exec'd as `numactl ARGS -- COMMAND` (directly for none) with HPCMEM_BINDING
and HPCMEM_NUMACTL_ARGS exported, so that its records say which binding it ran under.
HPCMEM_BINDING is the built-in name, `custom` for explicit arguments, or the --name
given (the workflow passes the config's name, as the point's folder and key spell it).

With --skip-unavailable, a builtin binding this node cannot provide (hbw on a node
without HBW nodes) does not fail: the command is exec'd without numactl and with
HPCMEM_SKIP_REASON set to why, and `hpcmem collectives` then records every point as
skipped with that reason. A malformed binding, or an explicit one naming a node or CPU
that does not exist, still exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil

from hpcmem.cli import UsageError, bad_input

HELP = "run a command under this rank's numactl binding (none, cores, hbw, dram, interleave)"
#: a binding's name as records, point keys and workflow folders spell it
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpcmem bind``."""
    parser.add_argument(
        "--local-rank",
        metavar="N",
        default=None,
        help="this rank's index on its node (default: from the launcher's environment)",
    )
    parser.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="when this node cannot provide the binding, run COMMAND unbound with "
        "HPCMEM_SKIP_REASON set (hpcmem collectives then writes skipped records)",
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        default=None,
        help="the name the records give the binding (HPCMEM_BINDING): lower-case letters, "
        "digits and _, starting with a letter; default: the built-in name, or custom for "
        "explicit numactl arguments",
    )
    parser.add_argument(
        "binding",
        metavar="BINDING",
        help="none, cores, hbw, dram, interleave, or explicit numactl arguments",
    )
    parser.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command to run and its arguments",
    )


def run(args: argparse.Namespace) -> int:
    """Plan the binding, export it, and exec the command under numactl."""
    from hpcmem.node.launcher import parse_rank
    from hpcmem.node.planned import BindingError, plan_binding

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError("COMMAND: missing (hpcmem bind BINDING -- COMMAND ARGS...)")
    rank = None if args.local_rank is None else parse_rank(args.local_rank, name="--local-rank")
    if args.name is not None and not NAME.fullmatch(args.name):
        raise UsageError(f"--name: {args.name!r} is not a binding name (lower-case letters, "
                         "digits and _, starting with a letter, at most 40)")
    with bad_input(BindingError):
        plan = plan_binding(args.binding, rank,
                            skip_unavailable=args.skip_unavailable)
    if args.name is not None:
        plan = dataclasses.replace(plan, binding=args.name)
    if plan.args and shutil.which("numactl") is None:
        raise UsageError(f"binding {args.binding!r}: numactl not found (apt install numactl)")
    os.environ.update(plan.environment())
    argv = [*plan.command_prefix, *command]
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        raise UsageError(f"COMMAND {command[0]!r}: {error.strerror}") from None
    return 127  # not reached: execvp replaced this process
