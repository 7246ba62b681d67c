"""Values as Slurm's client commands print them: time limits, TRES lists, job counts.

Each parser checks what it reads (:mod:`hpcmem.inputs`): a value not in Slurm's form is a
:class:`~hpcmem.errors.BadInputError` naming the command's field.
"""

from __future__ import annotations

import math

from hpcmem.inputs import matching, whole_number

__all__ = ["count", "minutes", "tres"]

#: what Slurm prints for a limit that is not set
_UNSET = ("", "UNLIMITED", "INFINITE", "NONE", "N/A")
#: the largest number Slurm keeps in a limit (64 bits)
_MOST = 2**63 - 1
#: MB per unit of a TRES memory value (Slurm's default unit is MB)
_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


def minutes(value: str, field: str) -> int | None:
    """Slurm's ``[days-]hours:minutes:seconds`` (or ``UNLIMITED``) in whole minutes (a
    started minute counts); a bare number is minutes, as sacctmgr's MaxWall may be."""
    if value in _UNSET:
        return None
    days, clock = matching(value, r"(?:([0-9]+)-)?([0-9]+(?::[0-9]+){0,2})", field,
                           what="a time limit",
                           accepted="[days-]hours:minutes:seconds, or UNLIMITED").groups()
    fields = [int(part) for part in clock.split(":")]
    if len(fields) == 1 and not days:
        return fields[0]
    while len(fields) < 3:
        fields.insert(0, 0)
    hours, mins, seconds = fields
    return (int(days or 0) * 24 + hours) * 60 + mins + (1 if seconds else 0)


def tres(value: str, field: str) -> dict[str, int]:
    """A TRES list (``cpu=2,mem=4G,node=1,gres/gpu=1``) as name -> amount, memory in MB.

    >>> tres("cpu=2,mem=4G,gres/gpu:h100=1", "MaxTRESPerJob")
    {'cpu': 2, 'mem': 4096, 'gres/gpu:h100': 1}
    """
    found: dict[str, int] = {}
    for item in value.split(",") if value not in _UNSET else ():
        name, amount, unit = matching(
            item, r"([a-z][\w/:.-]*)=([0-9]+)([KMGTP]?)", field, what="a TRES limit",
            accepted="name=amount pairs separated by ',', e.g. cpu=2,mem=4G").groups()
        number = whole_number(amount, field, minimum=0, maximum=_MOST)
        found[name] = math.ceil(number * _MB[unit or "M"]) if name == "mem" else number
    return found


def count(value: str, field: str) -> int | None:
    """A job count limit (MaxJobs, GrpSubmitJobs ...); None when unset."""
    return None if value in _UNSET else whole_number(value, field, minimum=0, maximum=_MOST)
