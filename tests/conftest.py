"""Shared pytest fixtures: real Open MPI launches, GPU detection, the hpcmem executable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The `slurm_cluster` fixture: a real one-node Slurm cluster (tests/slurm_cluster.py); the
# container runtime and the CPU image built once per session (tests/container_image.py); a
# real InfluxDB server for the session (tests/influxdb_server.py).
pytest_plugins = ("slurm_cluster", "container_image", "influxdb_server")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` on machines without a CUDA device."""
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run benchmarks/gpu/run.sh on a GPU node)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def hpcmem_exe() -> str:
    """Path of the installed ``hpcmem`` console script."""
    exe = BIN / "hpcmem"
    assert exe.exists(), f"{exe} missing: run `make setup`"
    return str(exe)


def mpi_environment() -> dict[str, str]:
    """Environment for mpirun on a small, possibly root-owned test machine."""
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


@pytest.fixture(scope="session")
def mpirun():
    """Run a command under ``mpirun -n N`` with real Open MPI ranks; returns CompletedProcess."""
    launcher = shutil.which("mpirun")
    if launcher is None:
        pytest.fail("mpirun not found: run `make setup` (installs openmpi-bin)")

    def run(ranks: int, *command: str, env: dict[str, str] | None = None, timeout: float = 300):
        full_env = mpi_environment()
        full_env.update(env or {})
        return subprocess.run(
            [launcher, "-n", str(ranks), *command],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=REPO,
        )

    return run
