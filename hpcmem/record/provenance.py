"""Provenance: the fields every record carries, saying where, when and from what it came.

Every record names the commit it was made from: the checkout's, or ``HPCMEM_GIT_SHA`` where
there is no checkout (an installed wheel, a copy on a GPU node). The node state, binding and
container come from :mod:`hpcmem.node`; nothing here knows any benchmark but the one it is
handed, so a measuring rank loads only its own spec.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import subprocess
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from hpcmem import __version__
from hpcmem.node.applied import cpu_affinity
from hpcmem.node.probe import current_container
from hpcmem.node.state import node_state
from hpcmem.record.spec import Benchmark

__all__ = [
    "GIT_SHA_ENV",
    "SCHEMA_VERSION",
    "STATUSES",
    "common_fields",
    "git_sha",
    "slurm_job_order",
    "slurm_system",
    "utc_now",
]

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "skipped")
#: the commit a record was made from, for a process that runs outside a git checkout
GIT_SHA_ENV = "HPCMEM_GIT_SHA"


@cache
def git_sha(checkout: str | os.PathLike[str] | None = None) -> str | None:
    """``HPCMEM_GIT_SHA`` when set, else the commit of ``checkout`` (default: the one hpcmem
    is imported from), else None (an installed copy, and no commit passed in)."""
    if sha := os.environ.get(GIT_SHA_ENV, "").strip():
        return sha
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=checkout or Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def utc_now() -> str:
    """The current time as UTC ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def slurm_system() -> str | None:
    """``cluster:partition`` of the Slurm job this process runs in, or None outside Slurm."""
    cluster = os.environ.get("SLURM_CLUSTER_NAME")
    partition = os.environ.get("SLURM_JOB_PARTITION")
    return f"{cluster}:{partition.split(',')[0]}" if cluster and partition else None


def slurm_job_order(job_id: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key putting Slurm job ids in submission order: by number, an array task
    (``4711_3``) or a heterogeneous component (``4711+1``) after its job, and an id that is
    not a number after every one that is."""
    return tuple((0, int(part)) if part.isdecimal() else (1, part)
                 for part in job_id.replace("+", "_").split("_"))


def common_fields(
    spec: Benchmark,
    *,
    binding: dict[str, Any],
    status: str = "ok",
    reason: str | None = None,
    run_id: str | None = None,
    node: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields every record of ``spec``'s benchmark carries, filled from this process and
    its environment.

    ``node`` is the node state measured around the point (:mod:`hpcmem.node.state`);
    without one, the state of this process's CPUs now, other busy CPUs not measured."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": spec.name,
        "run_id": run_id or os.environ.get("HPCMEM_RUN_ID") or uuid.uuid4().hex[:12],
        "timestamp": utc_now(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "system": slurm_system(),
        "git_sha": git_sha(),
        "hpcmem_version": __version__,
        "container": current_container(),
        "binding": binding,
        "node": node or node_state(cpu_affinity(), 1),
        "status": status,
        "reason": reason,
    }
