"""The ``hpcmem`` command line: one subcommand per module in this package.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; it maps arguments to the domain code and the domain's errors to
exit codes (:func:`bad_input` and every :class:`hpcmem.errors.BadInputError`: 2),
nothing else. Command modules import heavy
dependencies (torch, mpi4py, pandas) inside ``run`` so that ``hpcmem --help`` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hpcmem import __version__
from hpcmem.errors import BadInputError, clip

#: subcommand name -> module under hpcmem.cli
COMMANDS: dict[str, str] = {
    "info": "info",
    "collectives": "collectives",
    "train": "train",
    "bind": "bind",
    "aggregate": "aggregate",
    "report": "report",
    "check": "check",
    "export": "export",
    "preflight": "preflight",
}


class UsageError(BadInputError):
    """A bad option value: printed as one line, exit code 2."""


@contextmanager
def bad_input(*errors: type[Exception], where: str = "") -> Iterator[None]:
    """One of ``errors`` raised inside is bad input: a :class:`UsageError` (exit 2) whose
    message starts with ``where`` (the option or argument the value came from), if given."""
    try:
        yield
    except errors as error:
        raise UsageError(f"{where}: {error}" if where else str(error)) from None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand; with ``only``, the other
    subcommands' modules are not imported (``hpcmem bind`` under a launcher, once per
    rank, loads no NumPy)."""
    parser = argparse.ArgumentParser(
        prog="hpcmem",
        description="Memory placement for HPC and deep-learning jobs: "
        "HBW buffers for MPI collectives, Unified Memory for PyTorch training, "
        "and the tools that aggregate, report and check their results.",
    )
    parser.add_argument("--version", action="version", version=f"hpcmem {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            subparsers.add_parser(name)
            continue
        module = importlib.import_module(f"hpcmem.cli.{module_name}")
        sub = subparsers.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run, command_parser=sub)
    return parser


def refuse_unknown(sub: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Exit 2 through the subcommand's own usage, naming the options it does not know and
    the closest it does."""
    known = [o for action in sub._actions for o in action.option_strings]
    hints = [f"{word} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
        word.split("=", 1)[0], known, n=1)) else word for word in unknown]
    sub.error(f"unrecognized arguments: {' '.join(hints)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcmem`` console script."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=words[0] if words and words[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(words)
    if unknown:
        refuse_unknown(args.command_parser, unknown)
    try:
        return int(args.handler(args) or 0)
    except BadInputError as error:  # a bad option, an unreadable input, an unusable output
        print(f"hpcmem {args.command}: error: {clip(str(error))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
