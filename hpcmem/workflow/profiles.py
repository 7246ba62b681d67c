"""The folder a profile name stands for, the same from any working directory.

Snakemake looks a bare profile name up in the current folder first, then in its config
folders (``~/.config/snakemake``, ``/etc/xdg/snakemake``): from a checkout,
``--profile hpcmem`` is the package folder ``./hpcmem/``. hpcmem's own entry points
(``hpcmem preflight``, ``tools/nightly.sh``) look a bare name up in Snakemake's config
folders first and the current folder last, and hand Snakemake the folder they found.
When the name is a folder in more than one of these places, :attr:`ProfileChoice.note`
names each and the one taken. A value holding ``/`` (or ``.``, ``..``, ``~...``) is a path,
taken as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hpcmem.inputs import refused

__all__ = ["SITE_PROFILE", "ProfileChoice", "profile_places", "resolve_profile"]

#: the documented name of a site profile: never a folder of the checkout
SITE_PROFILE = "hpcmem-site"


@dataclass(frozen=True)
class ProfileChoice:
    """A profile found: its folder and settings file, and a note when its name was
    ambiguous."""

    folder: Path
    settings: Path
    note: str | None = None


def profile_places() -> list[Path]:
    """Where a bare name is looked up, in this order: Snakemake's config folders (the
    user's, then the site's), then the current folder."""
    from snakemake.common import get_appdirs

    dirs = get_appdirs()
    return [Path(dirs.user_config_dir), Path(dirs.site_config_dir), Path.cwd()]


def _is_path(value: str) -> bool:
    return os.sep in value or value in (".", "..") or value.startswith("~")


def _settings(candidate: Path) -> Path | None:
    """The settings file Snakemake reads for the profile at ``candidate``, or None."""
    from snakemake.cli import get_profile_dir

    try:
        found = get_profile_dir(str(candidate)) if os.path.exists(candidate) else None
    except (OSError, ValueError):  # a name too long for a path, or holding NUL
        return None
    return found[1] if found else None


def resolve_profile(value: str, field: str = "--profile") -> ProfileChoice:
    """The profile ``value`` names; InputError naming ``field`` and every place looked in
    when there is none."""
    places = profile_places()
    looked = ", ".join(str(place) for place in places)
    accepted = f"a folder holding config.yaml, or the name of one in {looked}"
    if not value:
        raise refused(field, value, "is not a profile", accepted)
    if _is_path(value):
        folder = Path(os.path.expanduser(value)).absolute()
        if (settings := _settings(folder)) is None:
            raise refused(field, value, "is not a profile", accepted)
        return ProfileChoice(folder, settings)
    candidates = [place / value for place in places if (place / value).exists()]
    found = [(folder, settings) for folder in candidates
             if (settings := _settings(folder)) is not None]
    if not found:
        holds = f" ({', '.join(map(str, candidates))} holds no config.yaml)" if candidates else ""
        raise refused(field, value, f"is not a profile{holds}", accepted)
    folder, settings = found[0]
    note = None
    if len(candidates) > 1:
        each = "; ".join(f"{c}{'' if _settings(c) else ' (no config.yaml)'}" for c in candidates)
        note = (f"{field}: {value!r} names {len(candidates)} folders: {each}; took {folder} "
                f"(a name is looked up in {looked}, in this order; give a path to take another)")
    return ProfileChoice(folder, settings, note)
