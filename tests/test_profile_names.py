"""The site profile's documented name works from any folder: the checkout (which holds the
package folder hpcmem/), a $HOME holding a checkout named hpcmem, and an unrelated folder.

Snakemake's dry run through the profile by name, and the nightly's own lookup (its cron
line, run from $HOME), each from the three folders; a name that is a folder in two places
is taken from Snakemake's config folder with a note naming both; a name found nowhere is
refused naming every place looked in. No cluster: the preflight against one is in
test_slurm_preflight.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_site import checkout_workdir

from hpcmem.workflow.profiles import SITE_PROFILE

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A $HOME holding a checkout named hpcmem, the site profile copied as the docs say,
    a working directory and an unrelated folder."""
    (tmp_path / "hpcmem").symlink_to(REPO)
    config = tmp_path / ".config" / "snakemake"
    config.mkdir(parents=True)
    shutil.copytree(REPO / "profiles" / "slurm", config / SITE_PROFILE)
    (tmp_path / "work").mkdir()
    checkout_workdir(tmp_path / "work")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


def run(command: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SNAKEMAKE_PROFILE")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**env, "HOME": str(home)})


def nightly_check(profile: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "python"), "-m", "hpcmem.nightly", "check", "--run-id", "night1",
                "--profile", profile, "--workdir", str(home / "work"), "--output-dir",
                "results", "--history", "results/nightly-history"], home, cwd)


def folders(home: Path) -> dict[str, Path]:
    return {"checkout": REPO, "home": home, "elsewhere": home / "elsewhere"}


@pytest.mark.parametrize("where", ["checkout", "home", "elsewhere"])
def test_snakemake_takes_the_documented_name_from_any_folder(home: Path, where: str) -> None:
    done = run([str(BIN / "snakemake"), "--profile", SITE_PROFILE, "-n", "--snakefile",
                str(home / "hpcmem" / "workflow" / "Snakefile"), "--directory",
                str(home / "work")], home, folders(home)[where])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Using profile {SITE_PROFILE} for setting" in done.stdout + done.stderr
    assert "rule run_collectives" in done.stdout + done.stderr


@pytest.mark.parametrize("where", ["checkout", "home", "elsewhere"])
def test_the_nightly_finds_the_documented_name_from_any_folder(home: Path, where: str) -> None:
    done = nightly_check(SITE_PROFILE, home, folders(home)[where])
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{home}/.config/snakemake/{SITE_PROFILE}\n"


def test_an_ambiguous_name_is_taken_from_the_config_folder_naming_both(home: Path) -> None:
    # the old documented name: from $HOME it is also the checkout itself
    shutil.copytree(REPO / "profiles" / "slurm", home / ".config" / "snakemake" / "hpcmem")
    done = nightly_check("hpcmem", home, home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{home}/.config/snakemake/hpcmem\n"
    assert done.stderr == (
        f"nightly: note: HPCMEM_PROFILE: 'hpcmem' names 2 folders: {home}/.config/snakemake/"
        f"hpcmem; {home}/hpcmem (no config.yaml); took {home}/.config/snakemake/hpcmem (a "
        f"name is looked up in {home}/.config/snakemake, /etc/xdg/snakemake, {home}, in this "
        "order; give a path to take another)\n")


def test_a_name_found_nowhere_names_every_place_looked_in(home: Path) -> None:
    done = nightly_check("hpcmem", home, REPO)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"nightly: HPCMEM_PROFILE: 'hpcmem' is not a profile ({REPO}/hpcmem holds no "
        f"config.yaml) (accepted: a folder holding config.yaml, or the name of one in "
        f"{home}/.config/snakemake, /etc/xdg/snakemake, {REPO})\n")


def test_the_cron_line_from_home_takes_the_profile_by_name(home: Path) -> None:
    cron = (REPO / "profiles" / "slurm" / "nightly.cron").read_text().splitlines()
    (line,) = [line for line in cron if line[:1].isdigit()]
    command = " ".join(line.split()[5:7])
    assert command == f"HPCMEM_PROFILE={SITE_PROFILE} $HOME/hpcmem/tools/nightly.sh"
    # the dry run stops the nightly after its lookup: it says how it runs, then that no
    # check ran (exit 2), never that the profile is not one
    done = run(["bash", "-c", f"HPCMEM_WORKDIR=$HOME/work {command} -n"], home, home)
    assert done.returncode == 2
    assert done.stdout.startswith("nightly: run nightly-")
    assert f" with profile {home}/.config/snakemake/{SITE_PROFILE} in {home}/work (" in \
        done.stdout.splitlines()[0]
    assert "is not a profile" not in done.stderr
