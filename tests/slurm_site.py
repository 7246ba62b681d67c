"""What a cluster admin does for the site-like test cluster, following docs/slurm-site.md:
copy profiles/slurm to a profile outside the checkout, set its SITE lines, write the
site's sweep next to it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

__all__ = ["BIN", "REPO", "run_logged", "site_profile"]


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts; None removes the key."""
    *parents, key = dotted.split(".")
    for name in parents:
        tree = tree.setdefault(name, {})
    if value is None:
        tree.pop(key, None)
    else:
        tree[key] = value


def site_profile(folder: Path, cluster: SlurmCluster, sweep: dict[str, Any],
                 **changes: Any) -> Path:
    """A copy of profiles/slurm in ``folder`` with its SITE lines set for ``cluster``, the
    site's ``sweep`` as its sweep.yaml, then ``changes`` (dotted keys, ``__`` for ``.``)."""
    shutil.copytree(REPO / "profiles" / "slurm", folder)
    profile = yaml.safe_load((folder / "config.yaml").read_text())
    cpus = int(cluster.run("sinfo", "-h", "-p", cluster.partition, "-o", "%c").stdout.split()[0])
    site = {
        "slurm-qos": cluster.qos,
        "slurm-init-seconds-before-status-checks": 2,  # a small, quiet cluster
        "retries": 0,
        "default-resources.slurm_partition": cluster.partition,
        "default-resources.slurm_account": cluster.account,
        "set-resources.build_wheel.cpus_per_task": cpus,
        "set-resources.run_collectives.slurm_partition": cluster.other_partition,
        "set-resources.run_train.slurm_partition": cluster.partition,
        "set-resources.run_train.gpu": 0,
        "set-resources.run_train.cpus_per_task": 1,
        "set-resources.run_train.mem_mb": 2000,
    }
    site.update({key.replace("__", "."): value for key, value in changes.items()})
    for dotted, value in site.items():
        # profile keys hold dashes and dots: only resources are nested
        if dotted.startswith(("default-resources.", "set-resources.")):
            _set(profile, dotted, value)
        elif value is None:
            profile.pop(dotted, None)
        else:
            profile[dotted] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return folder


def run_logged(command: list[str], cluster: SlurmCluster, cwd: Path, timeout: float = 300,
               **extra_env: str) -> subprocess.CompletedProcess:
    """Run ``command`` against ``cluster`` (on its login host) with the venv first on PATH
    and ``extra_env`` set; output merged."""
    env = cluster.env(**extra_env)
    env["PATH"] = f"{BIN}:{env['PATH']}"
    return subprocess.run(cluster.on_login(command), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, timeout=timeout)
