"""What a cluster admin does for the site-like test cluster, following docs/slurm-site.md:
copy profiles/slurm to a profile outside the checkout, set its SITE lines, write the
site's sweep next to it.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

__all__ = ["BIN", "ONE_JOB_PER_POINT", "REPO", "SWEEP", "THREE_POINTS", "checkout_workdir",
           "drawn_jobs", "ensure", "limited_account", "limited_qos", "preflight", "run_logged",
           "site_profile", "submitted_from"]

#: the smallest sweep: one collectives point (allreduce on numpy, 2 ranks, bound to cores),
#: no training, no images
SWEEP = {
    "container": {"enabled": False},
    "collectives": {"ops": ["allreduce"], "buffers": ["numpy"], "tasks_per_node": [2],
                    "bindings": ["cores"], "emulate_hbw": "0"},
    "train": {"enabled": False},
}  # fmt: skip
#: three points: three collectives jobs can be queued at once (one job per point)
THREE_POINTS = {**SWEEP, "collectives": {**SWEEP["collectives"],
                                         "ops": ["allreduce", "bcast", "gather"]}}
#: site_profile changes for one Slurm job per point: the template's groups of points removed
ONE_JOB_PER_POINT = {"groups": None, "group-components": None}


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
                 unedited: bool = False, **changes: Any) -> Path:
    """A copy of profiles/slurm in ``folder`` with its SITE lines set for ``cluster``, the
    site's ``sweep`` as its sweep.yaml, then ``changes`` (dotted keys, ``__`` for ``.``).
    The SITE names (partitions, account, QOS; no GPU) are always the cluster's; the
    resource figures are made to let the test cluster's one node run the jobs side by side
    (the build on all its CPUs, small training jobs), unless ``unedited``: the template's."""
    shutil.copytree(REPO / "profiles" / "slurm", folder)
    profile = yaml.safe_load((folder / "config.yaml").read_text())
    site = {
        "slurm-qos": cluster.qos,
        "slurm-init-seconds-before-status-checks": 2,  # a small, quiet cluster
        "retries": 0,
        "default-resources.slurm_partition": cluster.partition,
        "default-resources.slurm_account": cluster.account,
        "set-resources.run_collectives.slurm_partition": cluster.other_partition,
        # the native comparison runs where the image's points do (one group of points)
        "set-resources.run_collectives_native.slurm_partition": cluster.other_partition,
        "set-resources.run_train.slurm_partition": cluster.partition,
        "set-resources.run_train.gpu": 0,
        "set-resources.run_train_ranks.slurm_partition": cluster.partition,
    }
    if not unedited:
        cpus = cluster.run("sinfo", "-h", "-p", cluster.partition, "-o", "%c").stdout.split()
        site.update({
            "set-resources.build_wheel.cpus_per_task": int(cpus[0]),
            "set-resources.run_train.cpus_per_task": 1,
            "set-resources.run_train.mem_mb": 2000,
            "set-resources.run_train_ranks.cpus_per_task": 1,
            "set-resources.run_train_ranks.mem_mb": 2000,
        })
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


def checkout_workdir(work: Path) -> Path:
    """``work`` made a working directory holding the default configuration, as a checkout
    has it."""
    (work / "config").mkdir()
    for name in ("config.yaml", "references.yaml"):
        (work / "config" / name).write_text((REPO / "config" / name).read_text())
    return work


def preflight(cluster: SlurmCluster, profile: Path, workdir: Path, **extra_env: str
              ) -> subprocess.CompletedProcess:
    """``hpcmem preflight --profile PROFILE`` of the workflow run from ``workdir``."""
    return run_logged([str(BIN / "hpcmem"), "preflight", "--profile", str(profile),
                       "--snakefile", str(REPO / "workflow" / "Snakefile"),
                       "--directory", str(workdir)], cluster, cwd=workdir,
                      **extra_env)  # fmt: skip


def submitted_from(cluster: SlurmCluster, workdir: Path, since: str) -> list[str]:
    """Ids of the jobs submitted from ``workdir`` since ``since`` (sacct), or queued from
    it now (squeue)."""
    listed = cluster.run("sacct", "-X", "-n", "-P", "-S", since, "-o", "JobIDRaw,WorkDir%300")
    queued = cluster.run("squeue", "-h", "-o", "%i|%Z")
    return [line.split("|")[0] for line in [*listed.stdout.splitlines(),
                                            *queued.stdout.splitlines()]
            if line.split("|")[-1].rstrip("/") == str(workdir)]


def ensure(cluster: SlurmCluster, kind: str, name: str, *settings: str) -> None:
    """What the site's admin set up besides: an account or QOS (idempotent)."""
    field = "account" if kind == "account" else "name"
    listed = cluster.run("sacctmgr", "-n", "-P", "list", kind, name, f"format={field}")
    if not listed.stdout.strip():
        added = cluster.run("sacctmgr", "-i", "add", kind, name, *settings)
        assert added.returncode == 0, added.stderr


def drawn_jobs(page: str) -> list[list[str]]:
    """The rows of a report's table of Slurm jobs, each cell as text; [] without one."""
    found = re.search(r"<h3>Slurm jobs \(\d+\)</h3>.*?<tbody>(.*?)</tbody>", page, re.S)
    rows = re.findall(r"<tr>(.*?)</tr>", found[1], re.S) if found else []
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell))
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def limited_account(cluster: SlurmCluster, account: str, qos: str | None,
                    own: tuple[str, ...] = (), above: tuple[str, ...] = ()) -> None:
    """An account holding root, with ``own`` limits on root's association and ``above``
    on the account's; root may use QOS ``qos`` there."""
    ensure(cluster, "account", account, f"Description={account}", f"Organization={account}")
    listed = cluster.run("sacctmgr", "-n", "-P", "list", "assoc", "user=root",
                         f"account={account}", "format=account")
    if not listed.stdout.strip():
        added = cluster.run("sacctmgr", "-i", "add", "user", "root", f"Account={account}")
        assert added.returncode == 0, added.stderr
    for kind, settings in (("user", (*own, *([f"QOS+={qos}"] if qos else []))),
                           ("account", above)):
        where = ("root", "where", f"account={account}") if kind == "user" else (account,)
        if settings:
            changed = cluster.run("sacctmgr", "-i", "modify", kind, *where, "set", *settings)
            assert changed.returncode == 0, changed.stderr


def limited_qos(cluster: SlurmCluster, name: str, *limits: str) -> None:
    """A QOS with ``limits`` (set again when it exists)."""
    ensure(cluster, "qos", name)
    changed = cluster.run("sacctmgr", "-i", "modify", "qos", name, "set", *limits)
    assert changed.returncode == 0, changed.stderr
