"""tools/nightly.sh given settings it cannot use: each value that becomes a path (run id,
output and history folders, working directory, profile), and the push to a dashboard
(HPCMEM_EXPORT_*), is checked before anything is made: one line naming the variable,
exit 2, nothing created anywhere (not two levels up for HPCMEM_RUN_ID=../../escape). A
read-only output folder is named, and no verdict is claimed that was not written. A run id
whose run a workflow still runs is refused naming HPCMEM_RUN_ID (not the workflow's
run_id). No cluster: all of this happens before snakemake starts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hostile_inputs import ALIAS_BOMB

from hpcmem.nightly import INSIDE_PATH, RUN_ID
from hpcmem.workflow.run_lock import take_run_lock

REPO = Path(__file__).resolve().parents[1]
NIGHTLY = REPO / "tools" / "nightly.sh"
PYTHON = Path(sys.executable)
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
RUN_ID_ACCEPTS = "(accepted: 1 to 64 letters, digits, '.', '_' or '-', the first a letter or digit)"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """``tmp/a/b/work`` (the working directory, two levels below the top) and a profile."""
    (tmp_path / "a" / "b" / "work").mkdir(parents=True)
    shutil.copytree(REPO / "profiles" / "slurm", tmp_path / "profile")
    return tmp_path


def nightly(site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The nightly on the site's profile and working directory, with ``env`` on top."""
    work = site / "a" / "b" / "work"
    base = {"HPCMEM_PROFILE": str(site / "profile"), "HPCMEM_WORKDIR": str(work)}
    return subprocess.run([str(NIGHTLY)], capture_output=True, text=True, timeout=60, cwd=work,
                          env={**os.environ, **base, **env})


def test_the_patterns_are_the_workflow_schemas() -> None:
    assert SCHEMA["properties"]["run_id"]["pattern"] == RUN_ID
    assert SCHEMA["$defs"]["inside_path"]["pattern"] == INSIDE_PATH
    assert SCHEMA["properties"]["output_dir"]["$ref"] == "#/$defs/inside_path"
    assert SCHEMA["properties"]["check"]["properties"]["history"]["$ref"] == \
        "#/$defs/inside_path"


@pytest.mark.parametrize(("env", "line"), [
    ({"HPCMEM_RUN_ID": "../../escape"}, f"HPCMEM_RUN_ID: '../../escape' is not a run id "
                                        f"{RUN_ID_ACCEPTS}"),
    ({"HPCMEM_RUN_ID": "\u0663"}, f"HPCMEM_RUN_ID: '\u0663' is not a run id {RUN_ID_ACCEPTS}"),
    ({"HPCMEM_RUN_ID": "night; rm -rf ~"}, "HPCMEM_RUN_ID: 'night; rm -rf ~' is not a run id"),
    ({"HPCMEM_RUN_ID": "x" * 65}, f"HPCMEM_RUN_ID: '{'x' * 65}' is not a run id"),
    ({"HPCMEM_OUTPUT_DIR": "../../out"}, "HPCMEM_OUTPUT_DIR: '../../out' leaves {work} ('..') "
                                         "(accepted: a relative path inside {work}, without "
                                         "'..')"),
    ({"HPCMEM_OUTPUT_DIR": "{site}/out"}, "HPCMEM_OUTPUT_DIR: '{site}/out' is an absolute path"),
    ({"HPCMEM_OUTPUT_DIR": "res$(touch x)"}, "HPCMEM_OUTPUT_DIR: 'res$(touch x)' is not a path "
                                             "the workflow writes (accepted: a relative path "
                                             "inside HPCMEM_WORKDIR of letters, digits, '.', "
                                             "'_', '-' and '/')"),
    ({"HPCMEM_NIGHTLY_HISTORY": "results/../../history"},
     "HPCMEM_NIGHTLY_HISTORY: 'results/../../history' leaves {work} ('..')"),
    ({"HPCMEM_WORKDIR": "{site}/nowhere"}, "HPCMEM_WORKDIR: '{site}/nowhere' is not a folder "
                                           "(accepted: an existing folder"),
    ({"HPCMEM_PROFILE": "{site}/nowhere"}, "HPCMEM_PROFILE: '{site}/nowhere' is not a profile "
                                           "(accepted: a folder holding config.yaml"),
    ({"HPCMEM_EXPORT_TO": "http://influx:8086", "HPCMEM_EXPORT_DATABASE": "a b"},
     "HPCMEM_EXPORT_DATABASE: 'a b' is not a name (accepted: 1 to 64 letters"),
    ({"HPCMEM_EXPORT_TO": "http://influx:8086"},
     "HPCMEM_EXPORT_DATABASE, HPCMEM_EXPORT_BUCKET: neither is given (accepted: "
     "HPCMEM_EXPORT_DATABASE for InfluxDB 1.x, or HPCMEM_EXPORT_ORG and HPCMEM_EXPORT_BUCKET "
     "for InfluxDB 2.x)"),
], ids=["run-id-escape", "run-id-unicode-digit", "run-id-shell", "run-id-long",
        "output-escape", "output-absolute", "output-shell", "history-escape", "workdir",
        "profile", "push-database", "push-no-database"])  # fmt: skip
def test_a_setting_it_cannot_use_is_one_line_naming_the_variable(
    site: Path, env: dict[str, str], line: str
) -> None:
    places = {"site": site, "work": site / "a" / "b" / "work"}
    env = {key: value.format(**places) for key, value in env.items()}
    before = set(site.rglob("*"))
    done = nightly(site, **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"nightly: {line.format(**places)}"), done.stderr
    assert set(site.rglob("*")) == before


@pytest.mark.parametrize(("content", "line"), [
    (ALIAS_BOMB, "HPCMEM_PROFILE: {profile}/config.yaml:2: not valid YAML (aliases (*name) "
                 "are not accepted)"),
    ("- executor: slurm\n", "HPCMEM_PROFILE: {profile}/config.yaml: holds a YAML list, not a "
                            "mapping of settings (key: value lines)"),
], ids=["bomb", "list"])  # fmt: skip
def test_a_profile_it_cannot_read_is_named_at_once(site: Path, content: str, line: str) -> None:
    (site / "profile" / "config.yaml").write_text(content)
    before = set(site.rglob("*"))
    began = time.monotonic()
    done = nightly(site)
    assert time.monotonic() - began < 15
    assert done.returncode == 2
    assert done.stderr == f"nightly: {line.format(profile=site / 'profile')}\n"
    assert set(site.rglob("*")) == before


@pytest.mark.parametrize(("content", "problem"), [
    (b"\x7fELF\x02\x01\x01\x00garbage", "not a text file (NUL byte at offset 7)"),
    (b"run_id: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 11)"),
], ids=["binary", "latin1"])  # fmt: skip
def test_a_configfile_it_passes_on_is_named_before_snakemake_reads_it(
    site: Path, content: bytes, problem: str
) -> None:
    sweep = site / "sweep.bin"
    sweep.write_bytes(content)
    before = set(site.rglob("*"))
    work = site / "a" / "b" / "work"
    done = subprocess.run(
        [str(NIGHTLY), "--configfile", str(sweep)], capture_output=True, text=True, timeout=60,
        cwd=work, env={**os.environ, "HPCMEM_PROFILE": str(site / "profile"),
                       "HPCMEM_WORKDIR": str(work)})  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"nightly: --configfile: {sweep}: {problem}"), done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert set(site.rglob("*")) == before


def _read_only(folder: Path) -> list[str]:
    """A command prefix under which ``folder`` is an empty read-only mount (a namespace of
    its own); skips where mount namespaces are not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o ro none "{folder}" && exec "$@"',
              "read-only"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.strip()}")
    return prefix


def test_a_read_only_output_folder_is_named_and_no_verdict_is_claimed(site: Path) -> None:
    work = site / "a" / "b" / "work"
    prefix = _read_only(work / "results")
    done = subprocess.run(
        [*prefix, str(NIGHTLY)], capture_output=True, text=True, timeout=60, cwd=work,
        env={**os.environ, "HPCMEM_PROFILE": str(site / "profile"), "HPCMEM_WORKDIR": str(work),
             "HPCMEM_RUN_ID": "night1"})  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (f"nightly: HPCMEM_OUTPUT_DIR: {work}/results/night1: cannot write "
                           f"in {work}/results (Read-only file system)\n")
    assert done.stdout == ""


def test_a_verdict_that_cannot_be_written_is_not_claimed(site: Path) -> None:
    folder = site / "a" / "b" / "work" / "results"
    prefix = _read_only(folder)
    done = subprocess.run([*prefix, str(PYTHON), "-m", "hpcmem.nightly", "could-not-run",
                           str(folder / "night1" / "check"), "night1", "a reason"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (f"nightly: {folder}/night1/check/verdict.json: cannot write "
                           "(Read-only file system)\n")


def test_the_verdict_of_a_night_that_could_not_run(tmp_path: Path) -> None:
    check = tmp_path / "results" / "night1" / "check"
    done = subprocess.run([str(PYTHON), "-m", "hpcmem.nightly", "could-not-run", str(check),
                           "night1", "stopped by SIGTERM"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == done.stderr == ""
    verdict = json.loads((check / "verdict.json").read_text())
    assert (verdict["verdict"], verdict["run_id"], verdict["reason"]) == \
        ("could not run", "night1", "stopped by SIGTERM")
    assert (check / "verdict.txt").read_text() == \
        "# COULD NOT RUN: run night1: stopped by SIGTERM\n"
    assert sorted(p.name for p in check.iterdir()) == ["verdict.json", "verdict.txt"]


def test_settings_it_can_use_pass_and_nothing_is_made(site: Path) -> None:
    work = site / "a" / "b" / "work"
    (work / "shared").symlink_to(site)  # a history store elsewhere, linked from inside
    before = set(site.rglob("*"))
    done = subprocess.run([str(PYTHON), "-m", "hpcmem.nightly", "check", "--run-id",
                           "nightly-20261201", "--profile", str(site / "profile"), "--workdir",
                           str(work), "--output-dir", "results", "--history", "shared/history"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert set(site.rglob("*")) == before


def test_a_run_id_whose_run_is_running_is_refused_naming_hpcmem_run_id(site: Path) -> None:
    # the workflow would say `give this run another run_id`: the nightly takes HPCMEM_RUN_ID
    run = site / "a" / "b" / "work" / "results" / "held"
    lock = take_run_lock(run)
    try:
        before = set(site.rglob("*"))
        done = nightly(site, HPCMEM_RUN_ID="held")
        assert set(site.rglob("*")) == before
    finally:
        lock.release()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"nightly: HPCMEM_RUN_ID: 'held' is running: its folder {run} is in use (snakemake "
        f"process {os.getpid()} on {socket.gethostname()}, since "), done.stderr
    assert done.stderr.endswith(") (accepted: another HPCMEM_RUN_ID, or wait for that run to "
                                "end)\n"), done.stderr
