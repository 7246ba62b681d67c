"""Shared pytest fixtures: real Open MPI launches, GPU detection and PyTorch on the GPU,
the hpcmem executable; real ``torchrun`` launches (:func:`torchrun`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


#: fixtures that start or join a Slurm test cluster of the session
SLURM_FIXTURES = frozenset({"slurm_cluster", "small_cluster", "multinode_cluster"})
#: the modules that run jobs on the Slurm test clusters: one worker runs them all
SLURM_MODULES = frozenset({
    "test_multinode.py", "test_slurm_cluster.py", "test_slurm_groups.py",
    "test_slurm_limits.py", "test_slurm_preflight.py", "test_slurm_workflow.py",
    "test_workflow_containers.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` on machines without a CUDA device; order the session for
    its workers (:class:`ByCluster`)."""
    if not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run benchmarks/gpu/run.sh on a GPU node)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    for item in items:
        uses = item.get_closest_marker("slurm") or SLURM_FIXTURES & set(item.fixturenames)
        if uses and item.path.name not in SLURM_MODULES:
            raise pytest.UsageError(f"{item.nodeid} runs on a Slurm test cluster: add "
                                    f"{item.path.name} to SLURM_MODULES in tests/conftest.py")
    # the longest groups first (Slurm, then the VM guests), so that no worker is left with
    # one at the end; within each, the modules that need the CPU image last: it builds
    # while the others run
    waiting = {item.path for item in items if "cpu_image" in item.fixturenames}
    items.sort(key=lambda item: (item.path.name not in SLURM_MODULES,
                                 item.get_closest_marker("vm") is None, item.path in waiting))


#: the locks by which a ``quiet`` test has the machine to itself (:func:`machine_share`)
MACHINE_LOCKS = REPO / ".pytest_cache" / "machine"


@contextmanager
def machine_share(whole: bool) -> Iterator[None]:
    """Hold the machine shared with the other worker's tests, or ``whole``: alone, once its
    running test ends. The gate, held while waiting for the whole machine, keeps the other
    worker from starting tests meanwhile (no starvation by back-to-back shared holds)."""
    MACHINE_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(MACHINE_LOCKS / "gate", "a") as gate, open(MACHINE_LOCKS / "tests", "a") as tests:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(tests, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        if not whole:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Run a test marked ``quiet`` (it times against a quiet machine) with nothing of the
    other worker's running beside it, its fixtures' setup and teardown included."""
    with machine_share(whole=item.get_closest_marker("quiet") is not None):
        return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s two workers (``pytest -n 2``): :class:`ByCluster`."""
    from xdist.scheduler import LoadScopeScheduling

    class ByCluster(LoadScopeScheduling):
        """A module is one unit of work, so its module fixtures are made once; the
        :data:`SLURM_MODULES` are one unit: their jobs share the clusters' CPUs and queues,
        and tests that count queued jobs or time them must see only their own. Mostly
        waiting on Slurm's status polls, that unit runs beside the CPU-bound ones. Units go
        out in the session's order (``--no-loadscope-reorder``)."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "slurm" if Path(module).name in SLURM_MODULES else module

    return ByCluster(config, log)


@pytest.fixture(scope="session")
def torch() -> Any:
    """PyTorch on a CUDA GPU with hpcmem's native library, for the GPU tests (skipped
    without either)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("hpcmem._um")
    return torch


@pytest.fixture
def one_thread() -> Any:
    """PyTorch on one intra-op thread for the test: matrices this small run fastest so (two
    threads wait on each other when the machine's cores are busy)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def hpcmem_exe() -> str:
    """Path of the installed ``hpcmem`` console script."""
    exe = BIN / "hpcmem"
    assert exe.exists(), f"{exe} missing: run `make setup`"
    return str(exe)


#: every variable a launcher sets: none leaks in from the environment the tests run in
LAUNCH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
          "SLURM_LOCALID", "SLURM_NTASKS", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def rank_environment() -> dict[str, str]:
    """The tests' environment without a launcher's variables, one thread a process."""
    return {**{k: v for k, v in os.environ.items() if k not in LAUNCH}, "OMP_NUM_THREADS": "1"}


def torchrun(ranks: int, *arguments: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Python with ``arguments`` as ``ranks`` ranks of a real ``torchrun`` on this machine
    (``--standalone``: a free port), in :func:`rank_environment`."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(ranks), *arguments], env=rank_environment(),
                          capture_output=True, text=True, timeout=timeout)


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
