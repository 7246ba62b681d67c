"""This process's rank, on its node and in the job, as its launcher announces it.

Launchers name the ranks in variables of their own (:data:`LOCAL_RANK_VARIABLES`,
:data:`GLOBAL_RANK_VARIABLES`), read before MPI starts. A rank is ASCII digits up to
:data:`MAX_RANK`, nothing else: ``²``, ``٣``, `` 1``, ``1e3`` or ``-1`` is refused by name
rather than guessed at.

>>> local_rank({"SLURM_LOCALID": "3", "PMIX_RANK": "7"}), global_rank({})
(3, None)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from hpcmem.errors import BadInputError, clip

__all__ = [
    "GLOBAL_RANK_VARIABLES",
    "LOCAL_RANK_VARIABLES",
    "MAX_RANK",
    "RankError",
    "global_rank",
    "local_rank",
    "parse_rank",
]

#: where launchers put a rank's index on its node: Open MPI, Slurm, MPICH and Intel MPI,
#: Cray PALS, MVAPICH2, Flux; PMIX_RANK last, as it is global (right on one node only)
LOCAL_RANK_VARIABLES = (
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MPI_LOCALRANKID",
    "PALS_LOCAL_RANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "FLUX_TASK_LOCAL_ID",
    "PMIX_RANK",
)
#: where launchers put a rank's index in MPI_COMM_WORLD: Open MPI, PMIx, MPICH (PMI), Slurm
GLOBAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
#: the largest rank there can be: MPI numbers ranks with C ints
MAX_RANK = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,10}")


class RankError(BadInputError, ValueError):
    """A rank that is not ASCII digits from 0 to :data:`MAX_RANK`."""


def parse_rank(text: str, *, name: str) -> int:
    """``text`` as a rank; the :class:`RankError` otherwise names ``name`` and the value."""
    if _DIGITS.fullmatch(text) and int(text) <= MAX_RANK:
        return int(text)
    raise RankError(f"{name}={clip(text)!r} is not a rank (accepted: ASCII digits 0-{MAX_RANK})")


def _first_rank(names: Sequence[str], environ: Mapping[str, str] | None = None) -> int | None:
    """The rank in the first of ``names`` set in ``environ`` (default: this process's
    environment); None when none is set."""
    env = os.environ if environ is None else environ
    name = next((name for name in names if name in env), None)
    return None if name is None else parse_rank(env[name], name=name)


def local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank on its node; None when no launcher said."""
    return _first_rank(LOCAL_RANK_VARIABLES, environ)


def global_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank in the job; None when no launcher said."""
    return _first_rank(GLOBAL_RANK_VARIABLES, environ)
