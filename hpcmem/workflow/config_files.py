"""The files Snakemake reads before the workflow can check anything, read first with
hpcmem's own reader: a profile's settings, its sweep files, and every ``--configfile``.

Snakemake loads these while it parses its command line, before the Snakefile runs: a file
that is not UTF-8 text ends it in a ``UnicodeDecodeError`` traceback, an alias bomb takes
minutes and gigabytes, ``/dev/zero`` is read for ever. :func:`check_profile` reads them
with :func:`read_config_file` instead, so each is one line naming the option and the
file, at once. The documented entry points call it before they start Snakemake:
``hpcmem preflight``, ``tools/nightly.sh`` (through ``python -m hpcmem.nightly check``) and
``tools/run-workflow.sh``, which runs::

    python -m hpcmem.workflow.config_files PROFILE -- SNAKEMAKE_ARGS...

(one line, ``hpcmem: error: ...``, and exit status 2 for a file it refuses).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError
from hpcmem.inputs import InputError, refused, whole_number, yaml_mapping
from hpcmem.textfiles import TextFileError
from hpcmem.workflow.refusal import REFUSED

__all__ = ["MAX_BYTES", "check_profile", "given_configfiles", "main", "read_config_file"]

#: the most bytes a config file may hold (a sweep or a profile is a few kilobytes)
MAX_BYTES = 1 << 20
#: the most points of a group in one Slurm job a profile may ask for
_MOST_COMPONENTS = 100_000
#: snakemake's options naming config files, and the shortest abbreviation argparse takes
_CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")
_SHORTEST = "--configf"


def given_configfiles(snakemake_args: Sequence[str]) -> list[str]:
    """The files a snakemake command line gives with ``--configfile`` (or ``--configfiles``,
    an abbreviation argparse accepts, ``--configfile=FILE``), as argparse reads them: each
    word after the option up to the next option.

    >>> given_configfiles(["-n", "--configfile", "a.yaml", "b.yaml", "--configf=c.yaml", "all"])
    ['a.yaml', 'b.yaml', 'c.yaml']
    """
    files: list[str] = []
    taking = False
    for word in snakemake_args:
        if word.startswith("-") and word != "-":
            name, equals, value = word.partition("=")
            names_files = name.startswith(_SHORTEST) and any(
                option.startswith(name) for option in _CONFIGFILE_OPTIONS)
            taking = names_files and not equals  # FILE=... takes one word, the rest are targets
            if names_files and equals:
                files.append(value)
        elif taking:
            files.append(word)
    return files


def _sweep_files(folder: Path, named: Any) -> list[Path]:
    """The files a profile's ``configfile`` names, found as Snakemake finds them: one name
    in the profile's folder first, a list of names as given."""
    if named is None:
        return []
    if isinstance(named, list):
        return [Path(str(name)) for name in named]
    name = os.path.expanduser(os.path.expandvars(str(named)))
    return [folder / name if (folder / name).exists() else Path(name)]


def _profile_files(profile: str) -> tuple[Path, Path] | None:
    """The folder and settings file Snakemake reads for ``profile``, or None."""
    from snakemake.cli import get_profile_dir

    try:
        return get_profile_dir(profile) if profile else None
    except (OSError, ValueError):  # a name too long for a path, or holding NUL
        return None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings in the config file ``path``: a regular file (not a device or a pipe,
    which could be read for ever) of at most :data:`MAX_BYTES`, holding a mapping in UTF-8
    YAML without aliases; TextFileError names the file and why not."""
    with contextlib.suppress(OSError):  # unreadable: yaml_mapping says why
        found = os.stat(path)
        if not stat.S_ISREG(found.st_mode):
            raise TextFileError(f"{path}: not a regular file (a config file is YAML text)")
        if found.st_size > MAX_BYTES:
            raise TextFileError(f"{path}: {found.st_size} bytes, more than a config file "
                                f"holds (at most {MAX_BYTES})")
    return yaml_mapping(path)


def _mapping(path: Path, field: str) -> dict[str, Any]:
    try:
        return read_config_file(path)
    except TextFileError as error:
        raise InputError(f"{field}: {error}") from None


def _check_group_components(value: Any, field: str) -> None:
    """A profile's ``group-components`` (``{GROUP: N}`` or ``[GROUP=N, ...]``): N, the
    points of the group in one Slurm job, a whole number of at least 1. Snakemake refuses
    other values without naming the group or the value."""
    if value is None:
        return
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list) and all(isinstance(entry, str) for entry in value):
        entries = [entry.partition("=")[::2] for entry in value]
    else:
        raise refused(f"{field}: group-components", value, "is not a mapping",
                      "GROUP: N, N points of the group in each Slurm job")
    for group, count in entries:
        whole_number(count, f"{field}: group-components: {group}", minimum=1,
                     maximum=_MOST_COMPONENTS)


def check_profile(profile: str | None, configfiles: Sequence[str] | None = None, *,
                  field: str = "--profile") -> None:
    """Read what ``snakemake --profile PROFILE [--configfile FILE...]`` reads first: the
    profile's settings (found as Snakemake finds them), then the sweep files (those given,
    else those the profile names). Each must be a mapping in UTF-8 YAML without aliases;
    BadInputError names ``field`` (or ``--configfile``) and the file. The profile's
    ``group-components`` must be whole numbers of at least 1, each named when not."""
    from snakemake.common import get_appdirs

    sweeps = [Path(name) for name in configfiles or ()]
    if profile is not None:
        found = _profile_files(profile)
        if found is None:
            dirs = get_appdirs()
            raise refused(field, profile, "is not a profile",
                          "a folder holding config.yaml, or the name of one in the current "
                          f"folder, {dirs.user_config_dir} or {dirs.site_config_dir}")
        folder, settings = found
        mapping = _mapping(settings, field)
        _check_group_components(mapping.get("group-components"), f"{field} {profile}")
        sweeps = sweeps or _sweep_files(folder, mapping.get("configfile"))
    for path in sweeps:
        _mapping(path, "--configfile" if configfiles else field)


def main(argv: list[str] | None = None) -> int:
    """``python -m hpcmem.workflow.config_files PROFILE -- SNAKEMAKE_ARGS...``: the files
    ``snakemake --profile PROFILE SNAKEMAKE_ARGS...`` would read first; one line and exit
    status 2 for the first one refused."""
    parser = argparse.ArgumentParser(prog="python -m hpcmem.workflow.config_files",
                                     description=main.__doc__)
    parser.add_argument("profile", help="the profile snakemake is given")
    parser.add_argument("snakemake_args", nargs="*", help="the rest of its arguments")
    args = parser.parse_args(argv)
    try:
        check_profile(args.profile, given_configfiles(args.snakemake_args))
    except BadInputError as error:
        print(f"{REFUSED}{error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
