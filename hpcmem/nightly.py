"""What ``tools/nightly.sh`` asks of Python: its settings checked before it makes anything,
and the verdict ``could not run`` of a night that produced none.

``python -m hpcmem.nightly check --run-id ID --profile P --workdir DIR --output-dir DIR
--history DIR -- SNAKEMAKE_ARGS...`` checks each value the script turns into a path, as
the workflow's config schema accepts it, reads the profile's files and the
``--configfile`` files of SNAKEMAKE_ARGS as Snakemake would (:mod:`hpcmem.workflow.config`),
probes (leaving nothing) that the run's and the history's folders can be written, checks
the push to a dashboard the environment asks for (``HPCMEM_EXPORT_TO`` ...), and
prints the profile's folder (a name looked up as :mod:`hpcmem.workflow.profiles` says,
whatever the current folder holds). A refused value is one line naming its environment
variable or option, exit 2, and nothing is created; so is a run id whose run folder
another run of the workflow holds, saying to set another HPCMEM_RUN_ID.

``python -m hpcmem.nightly could-not-run FOLDER RUN_ID REASON`` writes ``verdict.json``
and ``verdict.txt`` there atomically; an unwritable folder is one line, exit 2, so that
the script never names a verdict it did not write. ``python -m hpcmem.nightly summary
VERDICT`` prints the verdict's short summary (at most about 20 lines), which the workflow
prints into the night's log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcmem.errors import BadInputError, clip
from hpcmem.inputs import inside, matching, refused
from hpcmem.outputs import OutputPathError, check_output_dir, write_errors
from hpcmem.record.jsonl import atomic_open
from hpcmem.workflow.profiles import ProfileChoice

__all__ = ["INSIDE_PATH", "PUSH_SETTINGS", "RUN_ID", "check_push_settings", "check_settings",
           "main", "verdict_summary", "write_could_not_run"]

#: a run id as workflow/schemas/config.schema.yaml accepts it (``run_id``)
RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: a path the workflow writes, as the schema accepts it (``$defs/inside_path``)
INSIDE_PATH = r"^(?!/)(?!(.*/)?[.][.](/|$))[A-Za-z0-9_.][A-Za-z0-9_./-]{0,255}$"
_PATH_CHARACTERS = "letters, digits, '.', '_', '-' and '/'"


def _inside_workdir(value: str, workdir: Path, variable: str) -> Path:
    """``workdir / value`` for a relative path the workflow accepts (a symbolic link there
    may lead elsewhere, as the schema says: a shared history store)."""
    target = inside(value, workdir, variable, links_may_leave=True)
    matching(value, INSIDE_PATH, variable, what="a path the workflow writes",
             accepted=f"a relative path inside HPCMEM_WORKDIR of {_PATH_CHARACTERS}")
    return target


def _writable(folder: Path, variable: str) -> None:
    try:
        check_output_dir(folder)
    except OutputPathError as error:
        raise OutputPathError(f"{variable}: {error}") from None


def check_settings(run_id: str, profile: str, workdir: str, output_dir: str,
                   history: str, snakemake_args: Sequence[str] = ()) -> ProfileChoice:
    """The profile found for ``profile``
    (:func:`~hpcmem.workflow.profiles.resolve_profile`), once every setting is usable.
    Raise BadInputError naming the environment variable of the first value the nightly
    cannot use (a run id whose folder another run holds too), or the first config file of
    ``snakemake_args`` (what the nightly passes on to snakemake) that cannot be read;
    nothing is created (folders are probed with a file that is removed)."""
    from hpcmem.workflow.config import check_profile, given_configfiles
    from hpcmem.workflow.run_lock import held_by

    matching(run_id, RUN_ID, "HPCMEM_RUN_ID", what="a run id",
             accepted="1 to 64 letters, digits, '.', '_' or '-', the first a letter or digit")
    if not Path(workdir).is_dir():
        raise refused("HPCMEM_WORKDIR", workdir, "is not a folder",
                      "an existing folder: where the sweep runs (default: the checkout)")
    run = _inside_workdir(output_dir, Path(workdir), "HPCMEM_OUTPUT_DIR") / run_id
    store = _inside_workdir(history, Path(workdir), "HPCMEM_NIGHTLY_HISTORY")
    if (holder := held_by(run)) is not None:
        raise refused("HPCMEM_RUN_ID", run_id, f"is running: its folder {run} is in use "
                      f"({holder})", "another HPCMEM_RUN_ID, or wait for that run to end")
    choice = check_profile(profile, given_configfiles(snakemake_args), field="HPCMEM_PROFILE")
    _writable(run, "HPCMEM_OUTPUT_DIR")
    _writable(store, "HPCMEM_NIGHTLY_HISTORY")
    assert choice is not None
    return choice


#: the nightly's push settings: the option of ``hpcmem export --to`` each stands for
PUSH_SETTINGS = {"--to": "HPCMEM_EXPORT_TO", "--format": "HPCMEM_EXPORT_FORMAT",
                 "--database": "HPCMEM_EXPORT_DATABASE", "--org": "HPCMEM_EXPORT_ORG",
                 "--bucket": "HPCMEM_EXPORT_BUCKET"}


def check_push_settings(env: Mapping[str, str]) -> None:
    """The push ``env`` asks for (``HPCMEM_EXPORT_TO`` and its settings), checked as
    ``hpcmem export --to`` checks its options, before the sweep rather than after it;
    BadInputError names the variables."""
    from hpcmem.results.export.destination import destination

    if not env.get(PUSH_SETTINGS["--to"]):
        return
    given = {option: env.get(variable) or None for option, variable in PUSH_SETTINGS.items()}
    try:
        destination(str(given["--to"]), given["--format"] or "influx",
                    database=given["--database"], org=given["--org"], bucket=given["--bucket"])
    except BadInputError as error:
        named = re.sub(r"--(to|format|database|org|bucket)\b",
                       lambda option: PUSH_SETTINGS[option[0]], str(error))
        raise BadInputError(named) from None


def write_could_not_run(folder: Path, run_id: str, reason: str) -> None:
    """``verdict.json`` and ``verdict.txt`` in ``folder``: the night could not run, and why."""
    verdict = {"verdict": "could not run", "run_id": run_id, "reason": reason,
               "checked_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "counts": {"PASS": 0, "FAIL": 0, "NOISY": 0, "NEW": 0, "MISSING": 0},
               "figures": []}
    texts = {"verdict.json": json.dumps(verdict, indent=1) + "\n",
             "verdict.txt": f"# COULD NOT RUN: run {run_id}: {reason}\n"}
    for name, text in texts.items():
        with write_errors(folder / name), atomic_open(folder / name) as handle:
            handle.write(text)


def verdict_summary(path: str) -> list[str]:
    """The short summary of the verdict at ``path``; BadInputError when it is unreadable."""
    from hpcmem.results.verdict import VerdictError, read_verdict, summary_lines

    try:
        return summary_lines(read_verdict(path))
    except VerdictError as error:
        raise BadInputError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpcmem.nightly", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check the nightly's settings")
    for option, variable in (("--run-id", "HPCMEM_RUN_ID"), ("--profile", "HPCMEM_PROFILE"),
                             ("--workdir", "HPCMEM_WORKDIR"),
                             ("--output-dir", "HPCMEM_OUTPUT_DIR"),
                             ("--history", "HPCMEM_NIGHTLY_HISTORY")):
        check.add_argument(option, required=True, help=f"the value of {variable}")
    check.add_argument("snakemake_args", nargs="*", metavar="-- SNAKEMAKE_ARGS",
                       help="what the nightly passes on to snakemake (its --configfile files "
                       "are read)")
    summary = commands.add_parser("summary", help="print a verdict's short summary")
    summary.add_argument("verdict", help="the run's check/verdict.json")
    verdict = commands.add_parser("could-not-run", help="write the verdict `could not run`")
    verdict.add_argument("folder", type=Path, help="the run's check folder")
    verdict.add_argument("run_id")
    verdict.add_argument("reason")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a refused setting or an unwritable folder: one line, exit 2."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            choice = check_settings(args.run_id, args.profile, args.workdir,
                                    args.output_dir, args.history, args.snakemake_args)
            check_push_settings(os.environ)
            if choice.note:
                print(f"nightly: note: {choice.note}", file=sys.stderr)
            print(choice.folder)
        elif args.command == "summary":
            print("\n".join(verdict_summary(args.verdict)))
        else:
            write_could_not_run(args.folder, args.run_id, args.reason)
    except BadInputError as error:
        print(f"nightly: {clip(str(error))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
