"""The ranks a launcher started: ``torchrun``'s variables, or Slurm's under ``srun``, the
process group they meet in, and what each hands to rank 0.

``torchrun --nproc-per-node N`` sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``; under ``srun`` the ranks come from ``SLURM_PROCID``,
``SLURM_LOCALID`` and ``SLURM_NTASKS``, with ``MASTER_ADDR`` and ``MASTER_PORT`` exported by
the job (as Lightning's SLURM environment reads them). :func:`launch_of` reads them, refusing
an environment that is not the ranks asked for; :func:`start` joins the default group
(NCCL on a GPU, gloo on the CPU) and makes a gloo group for results, so that a rank whose
GPU work failed still reports (:func:`gather`). Rank 0 merges what they hand it:
:func:`slowest_steps`, :func:`mean_steps` and :func:`largest`.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LAUNCHERS", "RENDEZVOUS", "Launch", "gather", "host_peak_bytes", "largest",
           "launch_of", "mean_steps", "slowest_steps", "start", "stop"]

#: each launcher's variables: rank, local rank, world size
LAUNCHERS = {"torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
             "srun": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")}
#: where the ranks meet
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """This process's place among the ranks ``launcher`` started."""

    rank: int
    local_rank: int
    world_size: int
    launcher: str

    def command(self) -> str:
        """How the run was started, as its record says."""
        if self.launcher == "torchrun":
            return f"torchrun --nproc-per-node {self.world_size}"
        return f"srun --ntasks {self.world_size}"


def launch_of(asked: int | None, environ: Mapping[str, str]) -> Launch | None:
    """The ranks of this run: torchrun's variables where ``WORLD_SIZE`` is set, else Slurm's
    where ``asked`` (``--world-size``) is given; None (one process) with neither. A
    ValueError says why the environment cannot be the ranks ``asked`` for."""
    if "WORLD_SIZE" in environ:
        launcher = "torchrun"
    elif asked is not None and "SLURM_NTASKS" in environ:
        launcher = "srun"
    elif asked is None:
        return None
    else:
        raise ValueError(f"--world-size {asked}: no ranks were started (neither torchrun's "
                         "RANK, LOCAL_RANK, WORLD_SIZE nor srun's SLURM_PROCID, "
                         f"SLURM_LOCALID, SLURM_NTASKS); run it under torchrun "
                         f"--nproc-per-node {asked}")
    values = []
    for name in LAUNCHERS[launcher]:
        text = environ.get(name, "")
        if not text.isdigit():
            raise ValueError(f"{name}={text!r}: a whole number is accepted, as {launcher} "
                             "sets it")
        values.append(int(text))
    rank, local_rank, world = values
    if not rank < world:
        raise ValueError(f"{LAUNCHERS[launcher][0]}={rank}: a rank below the world size "
                         f"({world}) is accepted")
    if asked is not None and asked != world:
        raise ValueError(f"--world-size {asked}: {launcher} started {world} ranks "
                         f"({LAUNCHERS[launcher][2]}={world})")
    for name in RENDEZVOUS:
        if not environ.get(name):
            raise ValueError(f"{name} is unset: the ranks meet at MASTER_ADDR:MASTER_PORT "
                             "(torchrun sets them; under srun export the first node's "
                             "address and a free port)")
    return Launch(rank, local_rank, world, launcher)


def start(launch: Launch, device_type: str = "cuda") -> tuple[Any, Any]:
    """Join the default group as ``launch``'s rank: NCCL on this rank's GPU (``device_type``
    ``cuda``) or gloo on the CPU, the launcher's variables exported in torchrun's names (as
    DeepSpeed reads them). This rank's device, and a gloo group for the results."""
    import torch
    import torch.distributed as dist

    for name, value in zip(LAUNCHERS["torchrun"],
                           (launch.rank, launch.local_rank, launch.world_size), strict=True):
        os.environ.setdefault(name, str(value))
    if device_type == "cuda":
        device = torch.device("cuda", launch.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)  # srun may show one GPU a task
        dist.init_process_group("nccl", rank=launch.rank, world_size=launch.world_size,
                                device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=launch.rank, world_size=launch.world_size)
    return device, dist.new_group(backend="gloo")


def stop() -> None:
    """Leave the process group (every rank, after :func:`gather`)."""
    import torch.distributed as dist

    dist.destroy_process_group()


def host_peak_bytes() -> int:
    """This process's peak resident host memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def gather(result: Mapping[str, Any], group: Any) -> list[dict[str, Any]]:
    """Every rank's ``result``, in rank order, on every rank (over ``group``: gloo, so that
    a rank whose NCCL work failed still reports)."""
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, dict(result), group=group)
    return every


def slowest_steps(series: Sequence[Sequence[float]]) -> list[float]:
    """Each step's time on its slowest rank (``series``: each rank's step times), over the
    steps every rank has."""
    steps = min((len(times) for times in series), default=0)
    return [max(times[i] for times in series) for i in range(steps)]


def mean_steps(series: Sequence[Sequence[float]]) -> list[float]:
    """Each step's value averaged over the ranks (``series``: each rank's, all as long)."""
    return [sum(values) / len(values) for values in zip(*series, strict=True)]


def largest(values: Sequence[Any]) -> Any:
    """The largest of the ranks' ``values`` that are known (None: none is)."""
    known = [value for value in values if value is not None]
    return max(known) if known else None
