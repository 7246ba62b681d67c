"""The config files snakemake reads before the workflow can check them
(hpcmem/workflow/config.py): found in a snakemake command line as argparse finds
them, and refused in one line naming the option and the file, exit 2, before snakemake
starts; through `make run`'s script too. Plain `snakemake --configfile` cannot be
intercepted: docs/configuration.md says what it prints."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hostile_inputs import ALIAS_BOMB

from hpcmem.workflow.config import MAX_BYTES, given_configfiles, main

REPO = Path(__file__).resolve().parents[1]
#: what each refused file holds, and how its line goes on after the file's name
REFUSED = [
    (b"\x7fELF\x02\x01\x01\x00\xff\xfe", ": not a text file (NUL byte at offset 7)"),
    (b"run_id: caf\xe9\n", ": not UTF-8 text (byte 0xe9 at offset 11)"),
    (ALIAS_BOMB.encode(), ":2: not valid YAML (aliases (*name) are not accepted)"),
    (b"- a list\n", ": holds a YAML list, not a mapping of settings"),
]


@pytest.mark.parametrize(("argv", "files"), [
    (["--configfile", "a.yaml", "b.yaml", "-n"], ["a.yaml", "b.yaml"]),
    (["--configfiles", "a.yaml", "--config", "run_id=x"], ["a.yaml"]),
    (["--configfi", "a.yaml", "--configfile=b.yaml", "all"], ["a.yaml", "b.yaml"]),
    (["--config", "run_id=x", "--cores", "2", "all"], []),
    (["--conf", "a.yaml"], []),  # ambiguous (--config, --configfile): argparse refuses it
], ids=["two", "plural", "abbreviated", "none", "ambiguous"])  # fmt: skip
def test_the_files_are_found_as_argparse_finds_them(argv: list[str], files: list[str]) -> None:
    assert given_configfiles(argv) == files


@pytest.mark.parametrize(("content", "problem"), REFUSED, ids=["binary", "latin1", "bomb",
                                                               "list"])
def test_a_configfile_is_one_line_naming_it(tmp_path: Path, content: bytes, problem: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_bytes(content)
    profile = str(REPO / "profiles" / "local")
    assert main([profile, "--", "-n", "--configfile", str(REPO / "config" / "config.yaml"),
                 str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpcmem: error: --configfile: {sweep}{problem}"), err
    assert err.count("\n") == 1
    assert main([profile, "--", "--configfile", str(REPO / "config" / "config.yaml")]) == 0


@pytest.mark.parametrize("device", ["/dev/zero", "fifo"])
def test_a_configfile_that_would_be_read_for_ever_is_refused_at_once(
    tmp_path: Path, device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if device == "fifo":
        device = str(tmp_path / "sweep.yaml")
        os.mkfifo(device)
    assert main([str(REPO / "profiles" / "local"), "--", "--configfile", device]) == 2
    assert capsys.readouterr().err == (f"hpcmem: error: --configfile: {device}: not a regular "
                                       "file (a config file is YAML text)\n")


def test_a_configfile_too_large_for_a_sweep_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("run_id: x\n" + "#" * MAX_BYTES)
    assert main([str(REPO / "profiles" / "local"), "--", "--configfile", str(sweep)]) == 2
    assert capsys.readouterr().err == (
        f"hpcmem: error: --configfile: {sweep}: {MAX_BYTES + 10} bytes, more than a config "
        f"file holds (at most {MAX_BYTES})\n")


def test_make_run_refuses_it_before_snakemake_starts(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_bytes(REFUSED[0][0])
    before = set((REPO / "results").glob("*")) if (REPO / "results").exists() else set()
    done = subprocess.run([str(REPO / "tools" / "run-workflow.sh"), "--configfile", str(sweep)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"hpcmem: error: --configfile: {sweep}{REFUSED[0][1]}")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    after = set((REPO / "results").glob("*")) if (REPO / "results").exists() else set()
    assert after == before  # nothing made in the checkout


@pytest.mark.parametrize(("components", "line"), [
    ("{points: 0}", "group-components: points: 0 is out of range"),
    ("{points: many}", "group-components: points: 'many' is not a whole number"),
    ("[points=2.5]", "group-components: points: '2.5' is not a whole number"),
    ("points", "group-components: 'points' is not a mapping"),
], ids=["zero", "word", "fraction", "not-a-mapping"])
def test_a_profiles_group_components_other_than_a_count_is_named(
    tmp_path: Path, components: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.yaml").write_text(f"executor: slurm\ngroup-components: {components}\n")
    assert main([str(tmp_path)]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith(f"hpcmem: error: --profile {tmp_path}: {line} (accepted: ")
    (tmp_path / "config.yaml").write_text("group-components: {points: 25}\n")
    assert main([str(tmp_path)]) == 0
