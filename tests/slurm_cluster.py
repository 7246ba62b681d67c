"""Pytest plugin: the ``slurm_cluster`` fixture, a real one-node Slurm cluster,
``small_cluster``, a second one set up as a small site, and ``multinode_cluster``, a real
two-node one.

The cluster (munged, MariaDB, slurmdbd, slurmctld, slurmd) is started by
``tools/slurm/cluster.sh`` under ``.slurm/`` for the session and stopped at its
end, also when tests fail. It is set up as production clusters are (SITE): two
partitions (batch, the default, and hbm) on its one node, account hpc, a QOS bench
besides the default normal (MaxWall 4 hours, 100 jobs queued per user at most), and
AccountingStorageEnforce=associations,limits,qos,
so jobs with an unknown partition, account or QOS are refused or never start.
Concurrent pytest sessions on one machine share the cluster: each holds a lease,
and the last one out stops it. When a test that uses the cluster fails, its report
lists the daemon logs.

The small site (same site settings, under ``.slurm/small-site/`` on ports of its own) has
2-CPU nodes, partitions with a MaxTime of 30 minutes and a DefaultTime of 5, and its QOS
bench limited (MaxWall 20 minutes, 1 CPU per job, 3 jobs queued per user).

The two-node cluster (same site settings, under ``.slurm-multinode/``) lives in network
namespaces that ``cluster.sh`` makes: its clients run in the head namespace
(``cluster.sh login``), which :meth:`SlurmCluster.run` and :meth:`SlurmCluster.on_login` do.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tools" / "slurm" / "cluster.sh"
STATE_DIR = Path(os.environ.get("HPCMEM_SLURM_STATE", REPO / ".slurm"))
MULTINODE_STATE_DIR = Path(os.environ.get("HPCMEM_SLURM_MULTINODE_STATE",
                                          REPO / ".slurm-multinode"))
#: nodes of the multi-node test cluster
MULTINODE = 2
#: the cluster.sh settings of the site-like test cluster
SITE = {
    "HPCMEM_SLURM_PARTITION": "batch,hbm",
    "HPCMEM_SLURM_ACCOUNT": "hpc",
    "HPCMEM_SLURM_QOS": "bench",
    "HPCMEM_SLURM_ENFORCE": "associations,limits,qos",
    # limits every job and sweep of the tests stays within, as a site's QOS has them
    "HPCMEM_SLURM_QOS_LIMITS": "MaxWall=240 MaxSubmitJobsPU=100",
}

#: a second one-node cluster, a small site (its own state dir and ports): 2-CPU nodes, a
#: MaxTime of 30 minutes, a DefaultTime of 5 and limits on its QOS (bench; normal has none)
SMALL_STATE_DIR = STATE_DIR / "small-site"
SMALL_SITE = {
    "HPCMEM_SLURM_PORT": str(int(os.environ.get("HPCMEM_SLURM_PORT", "16817")) + 6),
    "HPCMEM_SLURM_MYSQL_PORT": str(int(os.environ.get("HPCMEM_SLURM_MYSQL_PORT", "16306")) + 2),
    "HPCMEM_SLURM_CPUS": "2",
    "HPCMEM_SLURM_MAX_TIME": "30",
    "HPCMEM_SLURM_DEFAULT_TIME": "5",
    "HPCMEM_SLURM_QOS_LIMITS": "MaxWall=20 MaxTRESPerJob=cpu=1 MaxSubmitJobsPU=3",
}

__all__ = ["MULTINODE", "SITE", "SMALL_SITE", "SlurmCluster", "cluster_command",
           "multinode_cluster", "pid_alive", "session_cluster", "slurm_cluster",
           "small_cluster"]


@dataclass(frozen=True)
class SlurmCluster:
    """A running test cluster: its configuration, environment and logs."""

    state_dir: Path
    #: the default partition, and the second one
    partition: str = "batch"
    other_partition: str = "hbm"
    account: str = "hpc"
    qos: str = "bench"
    #: the command prefix that runs a client where it reaches the cluster (empty: anywhere)
    login: tuple[str, ...] = ()

    @property
    def conf(self) -> Path:
        """The generated slurm.conf (exported as ``SLURM_CONF``)."""
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def logs(self) -> list[Path]:
        """Every daemon log, kept after the cluster stops."""
        return sorted((self.state_dir / "log").glob("*.log"))

    def env(self, **extra: str) -> dict[str, str]:
        """The caller's environment with ``SLURM_CONF`` pointing at this cluster."""
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        env.update(extra)
        return env

    def on_login(self, command: list[str]) -> list[str]:
        """``command`` as run on the cluster's login host."""
        return [*self.login, *command]

    def run(self, *command: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, srun, sacct …) against this cluster."""
        kwargs.setdefault("env", self.env())
        return subprocess.run(
            self.on_login(list(command)), capture_output=True, text=True, timeout=timeout,
            cwd=REPO, **kwargs
        )


def cluster_command(action: str, state_dir: Path = STATE_DIR,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tools/slurm/cluster.sh ACTION STATE_DIR`` with the site-like settings (``env`` on
    top); raises with its stderr on failure."""
    result = subprocess.run(
        [str(CLUSTER_SH), action, str(state_dir)], capture_output=True, text=True, timeout=180,
        env={**os.environ, **SITE, **(env or {})},
    )
    if result.returncode != 0 and action != "status":
        raise RuntimeError(
            f"cluster.sh {action} failed (exit {result.returncode}):\n{result.stderr.strip()}\n"
            f"daemon logs: {state_dir / 'log'}"
        )
    return result


@contextmanager
def _leases(state_dir: Path) -> Iterator[Path]:
    """Hold the lease lock; yields the folder of per-session lease files."""
    leases = state_dir / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lease-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield leases


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def session_cluster(state_dir: Path, env: dict[str, str]) -> Iterator[None]:
    """Start (or join) the cluster of ``state_dir`` under a lease; the last one out stops it."""
    if os.geteuid() != 0:
        pytest.fail("the Slurm test cluster runs its daemons as root: run `make test` as root")
    lease = None
    with _leases(state_dir) as leases:
        lease = leases / str(os.getpid())
        lease.touch()
        try:
            cluster_command("start", state_dir, env)
        except Exception:
            lease.unlink()
            raise
    try:
        yield
    finally:
        with _leases(state_dir) as leases:
            lease.unlink(missing_ok=True)
            others = []
            for other in leases.iterdir():
                if other.name.isdigit() and pid_alive(int(other.name)):
                    others.append(other)
                else:
                    other.unlink()
            if not others:
                cluster_command("stop", state_dir, env)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start (or join) the site-like one-node test cluster for the session; stop it after."""
    with session_cluster(STATE_DIR, {}):
        yield SlurmCluster(STATE_DIR)


@pytest.fixture(scope="session")
def small_cluster() -> Iterator[SlurmCluster]:
    """Start (or join) the small site's cluster (:data:`SMALL_SITE`) for the session."""
    with session_cluster(SMALL_STATE_DIR, SMALL_SITE):
        yield SlurmCluster(SMALL_STATE_DIR)


@pytest.fixture(scope="session")
def multinode_cluster() -> Iterator[SlurmCluster]:
    """Start (or join) the site-like two-node test cluster (node1, node2) for the session."""
    env = {"HPCMEM_SLURM_NODES": str(MULTINODE)}
    with session_cluster(MULTINODE_STATE_DIR, env):
        yield SlurmCluster(MULTINODE_STATE_DIR, login=(
            str(CLUSTER_SH), "login", str(MULTINODE_STATE_DIR), "--"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """On a failed test that used the cluster, list the daemon logs in its report."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    cluster = next((funcargs[name] for name in ("slurm_cluster", "small_cluster",
                                                "multinode_cluster") if name in funcargs), None)
    if report.failed and isinstance(cluster, SlurmCluster):
        paths = "\n".join(str(path) for path in cluster.logs)
        report.sections.append(("Slurm daemon logs", paths))
    return report
