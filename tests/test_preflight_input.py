"""`hpcmem preflight` given a profile or sweep it cannot use: one line naming the option
and the file, exit 2, at once and in little memory (an alias bomb is not expanded), with
nothing written; and when snakemake itself refuses the run, the line keeps its reason.
No cluster: all of this happens before the preflight asks Slurm anything."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_inputs import ALIAS_BOMB

REPO = Path(__file__).resolve().parents[1]
HPCMEM = Path(sys.executable).parent / "hpcmem"
#: the most memory the refusal may take (snakemake's import alone takes about 150 MB)
MOST_KB = 400_000
#: runs argv[1:] with its output passed through, prints the child's peak RSS (KB), exits
#: with its status
MEASURE = ("import resource, subprocess, sys; "
           "status = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(status)")


def tree(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding a profile copied from profiles/slurm and a working directory."""
    shutil.copytree(REPO / "profiles" / "slurm", tmp_path / "profile")
    (tmp_path / "work" / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", tmp_path / "work" / "config")
    return tmp_path


def preflight(site: Path, *extra: str) -> tuple[int, str, float, int]:
    """Exit status, stderr, seconds and peak memory (KB) of `hpcmem preflight` on ``site``."""
    err = site / "stderr"
    command = [str(HPCMEM), "preflight", "--profile", str(site / "profile"),
               "--snakefile", str(REPO / "workflow" / "Snakefile"),
               "--directory", str(site / "work"), *extra]
    with err.open("w") as handle:
        began = time.monotonic()
        # a child forked from this (large) pytest process counts its RSS at the fork in its
        # peak: the preflight is started from a small Python that reports its child's peak
        done = subprocess.run([sys.executable, "-c", MEASURE, *command], stdout=subprocess.PIPE,
                              stderr=handle, cwd=site / "work", text=True, check=False)
        took = time.monotonic() - began
    text = err.read_text()
    err.unlink()
    return done.returncode, text, took, int(done.stdout.split()[-1])


@pytest.mark.parametrize(("name", "content", "message"), [
    ("config.yaml", "- executor: slurm\n- jobs: 50\n",
     "--profile: {profile}/config.yaml: holds a YAML list, not a mapping of settings"),
    ("config.yaml", ALIAS_BOMB,
     "--profile: {profile}/config.yaml:2: not valid YAML (aliases (*name) are not accepted)"),
    ("sweep.yaml", ALIAS_BOMB,
     "--profile: {profile}/sweep.yaml:2: not valid YAML (aliases (*name) are not accepted)"),
    ("sweep.yaml", b"train:\n  models: [caf\xe9]\n",
     "--profile: {profile}/sweep.yaml: not UTF-8 text (byte 0xe9 at offset 21): "
     "near b'  models: [caf\\xe9]'"),
], ids=["config-list", "config-bomb", "sweep-bomb", "sweep-latin1"])  # fmt: skip
def test_a_profile_file_it_cannot_read_is_one_line_at_once(
    site: Path, name: str, content: str | bytes, message: str
) -> None:
    path = site / "profile" / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = tree(site)
    status, err, took, peak_kb = preflight(site)
    assert status == 2, err
    assert err.splitlines() == [err.strip()] and "Traceback" not in err
    assert err.startswith("hpcmem preflight: error: " + message.format(profile=site / "profile"))
    assert took < 15 and peak_kb < MOST_KB, (took, peak_kb)
    assert tree(site) == before


def test_a_sweep_file_given_is_named_by_its_option(site: Path) -> None:
    (site / "bomb.yaml").write_text(ALIAS_BOMB)
    status, err, took, _ = preflight(site, "--configfile", str(site / "bomb.yaml"))
    assert status == 2 and took < 15
    assert err == (f"hpcmem preflight: error: --configfile: {site}/bomb.yaml:2: not valid YAML "
                   "(aliases (*name) are not accepted)\n")


def test_a_profile_that_is_not_there_is_named(site: Path) -> None:
    shutil.rmtree(site / "profile")
    status, err, _, _ = preflight(site)
    assert status == 2
    assert err.startswith(f"hpcmem preflight: error: --profile: '{site}/profile' is not a "
                          "profile (accepted: a folder holding config.yaml, or the name of one ")


def test_snakemakes_own_refusal_keeps_its_reason(site: Path) -> None:
    # the workflow's refusal comes after snakemake's noise; the line keeps what and where
    (site / "profile" / "sweep.yaml").write_text("collectives:\n  tasks_per_node: [abc]\n")
    status, err, _, _ = preflight(site)
    assert status == 2
    assert err == ("hpcmem preflight: error: snakemake stopped before the preflight (exit 2): "
                   "config collectives.tasks_per_node[0]: 'abc' is not of type 'integer' "
                   "(accepted: MPI ranks on each node; a point has nodes x tasks_per_node "
                   "ranks.)\n")
