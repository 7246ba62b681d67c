"""The limits a QOS or an association puts on jobs, as ``sacctmgr`` lists them.

A :class:`Limits` holds what one QOS, association or account sets, by sacctmgr's own
field names (so that a problem line names the setting an admin would change). Slurm
applies a user's association limits with inheritance: a ``Max`` limit its own association
leaves unset comes from the nearest account above that sets it; every ``Grp`` limit of
every account above applies as well (:func:`applying`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hpcmem.slurm.values import count, minutes, tres

__all__ = ["ASSOCIATION_FIELDS", "QOS_FIELDS", "Limits", "applying", "limits_from"]

#: TRES limits of a QOS, a job count limits and its wall time, as ``show qos format=``
QOS_FIELDS = ("MaxTRESPerJob", "MaxTRESPerNode", "MaxTRESPerUser", "GrpTRES",
              "MinTRESPerJob", "MaxWall", "MaxJobsPU", "MaxSubmitJobsPU", "GrpJobs",
              "GrpSubmitJobs")
#: the same of an association, as ``show assoc format=``
ASSOCIATION_FIELDS = ("MaxTRESPerJob", "MaxTRESPerNode", "GrpTRES", "MaxWall", "MaxJobs",
                      "MaxSubmitJobs", "GrpJobs", "GrpSubmitJobs")


@dataclass(frozen=True)
class Limits:
    """The limits one QOS or association sets (fields it leaves unset are left out)."""

    #: what sets them, as a problem line names it: ``QOS 'bench'``, ``account 'physics'``
    source: str
    #: TRES limits by field: ``{"MaxTRESPerJob": {"cpu": 4, "mem": 8000}}`` (memory in MB)
    tres: dict[str, dict[str, int]] = field(default_factory=dict)
    #: job count limits by field: ``{"MaxSubmitJobsPU": 20}``
    counts: dict[str, int] = field(default_factory=dict)
    #: MaxWall in minutes, or None
    max_wall_min: int | None = None

    def sets(self, name: str) -> bool:
        """Whether the field ``name`` is set here."""
        return (name in self.tres or name in self.counts
                or (name == "MaxWall" and self.max_wall_min is not None))


def limits_from(source: str, entry: dict[str, str], command: str) -> Limits:
    """The limits among the fields of one ``sacctmgr -P`` line (``entry``: field -> text);
    ``command`` names what printed them, for an error."""
    found_tres, counts = {}, {}
    for name, text in entry.items():
        if "TRES" in name and (amounts := tres(text, f"{command} {name}")):
            found_tres[name] = amounts
        elif "Jobs" in name and (number := count(text, f"{command} {name}")) is not None:
            counts[name] = number
    wall = minutes(entry.get("MaxWall", ""), f"{command} MaxWall")
    return Limits(source, found_tres, counts, wall)


def applying(chain: Iterable[Limits], name: str) -> list[Limits]:
    """Which of an association ``chain`` (the user's own first, then each account above)
    set the limit ``name`` that applies: every one for a ``Grp`` limit, else the first."""
    setting = [limits for limits in chain if limits.sets(name)]
    return setting if name.startswith("Grp") else setting[:1]
