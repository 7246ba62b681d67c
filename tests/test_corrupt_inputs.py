"""Corrupt inputs of ``hpcmem check`` and ``hpcmem report``: a history store, a summary's
samples, a verdict file, a run count past the bound. Each is one line naming the file,
where in it, the field and the value, exit status 2, and nothing written: no verdict, no
table, no history line, no report."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate

FIXTURES = Path(__file__).parent / "fixtures" / "records"
HBW8 = "collectives/allreduce/hbw/float32/ranks=2/binding=cores/size=8"
#: the history checks: past runs are compared from the first one on
HISTORY = "history: {last: 5, min_runs: 1}\n"


def run(*argv: str) -> tuple[int, str, str]:
    """``hpcmem ARGV`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def refused(result: tuple[int, str, str], command: str, *fragments: str) -> None:
    """Exit 2, nothing on stdout, and one line on stderr holding every fragment."""
    code, out, err = result
    assert (code, out) == (2, ""), err
    assert err.startswith(f"hpcmem {command}: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def run_of(tmp_path: Path, run_id: str) -> Path:
    """The collectives fixtures as run ``run_id``, aggregated: its summary folder."""
    folder = tmp_path / run_id
    folder.mkdir()
    records = [json.loads(line) for path in sorted((FIXTURES / "collectives").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    (folder / "r.jsonl").write_text("".join(json.dumps({**r, "run_id": run_id}) + "\n"
                                            for r in records))
    aggregate([folder], folder / "summary")
    return folder / "summary"


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "refs.yaml"
    path.write_text(HISTORY)
    return path


def outputs(tmp_path: Path) -> list[str]:
    """What a refused check must not have written."""
    return ["--verdict-out", str(tmp_path / "verdict.json"),
            "--table-out", str(tmp_path / "verdict.txt")]


def runs_in(history: Path) -> int:
    with sqlite3.connect(history / "history.sqlite") as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


@pytest.mark.parametrize(("column", "stored", "message"), [
    ("samples", "[1.0, oops", "samples: '[1.0, oops' is not JSON (Expecting value"),
    ("samples", '{"avg": [1.0]}', "samples: '{\"avg\": [1.0]}' is not a JSON list of finite "
     "numbers"),
    ("samples", "[1.0, NaN]", "samples: '[1.0, NaN]' is not a JSON list of finite numbers"),
    ("value", "fast", "value: 'fast' is not a finite number"),
])
def test_a_corrupt_history_figure_is_named_and_nothing_written(tmp_path: Path, refs: Path,
                                                               column: str, stored: str,
                                                               message: str) -> None:
    history = tmp_path / "history"
    assert run("check", str(run_of(tmp_path, "base")), "--references", str(refs),
               "--system", "site:part", "--history", str(history))[0] == 0
    figure = f"{HBW8}/latency_us.avg"
    with sqlite3.connect(history / "history.sqlite") as db:
        db.execute(f"UPDATE figures SET {column} = ? WHERE figure = ?", (stored, figure))
    result = run("check", str(run_of(tmp_path, "next")), "--references", str(refs),
                 "--system", "site:part", "--history", str(history), *outputs(tmp_path))
    refused(result, "check", f"--history: {history / 'history.sqlite'}: run 'base' on "
            f"site:part, figure {figure}: {message}")
    assert not (tmp_path / "verdict.json").exists() and not (tmp_path / "verdict.txt").exists()
    assert runs_in(history) == 1  # the next run was not appended


def test_the_real_cli_refuses_a_corrupt_history_without_a_traceback(hpcmem_exe: str,
                                                                    tmp_path: Path,
                                                                    refs: Path) -> None:
    history = tmp_path / "history"
    base = [hpcmem_exe, "check", "--references", str(refs), "--system", "s:p", "--history",
            str(history)]
    subprocess.run([*base, str(run_of(tmp_path, "base"))], check=True, capture_output=True)
    with sqlite3.connect(history / "history.sqlite") as db:
        db.execute("UPDATE figures SET samples = '[1.0, oops'")
    done = subprocess.run([*base, str(run_of(tmp_path, "next")), *outputs(tmp_path)],
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "samples: '[1.0, oops' is not JSON" in done.stderr
    assert not (tmp_path / "verdict.json").exists() and runs_in(history) == 1


@pytest.mark.parametrize("last", ["99999999999999999999", "1001", "0"])
def test_last_outside_1_to_1000_is_refused_before_anything(tmp_path: Path, refs: Path,
                                                           last: str) -> None:
    history = tmp_path / "history"
    result = run("check", str(run_of(tmp_path, "r")), "--references", str(refs), "--system",
                 "s:p", "--history", str(history), "--last", last, *outputs(tmp_path))
    refused(result, "check", f"--last: {last} is not a whole number from 1 to 1000")
    assert not (history / "history.sqlite").exists()
    assert not (tmp_path / "verdict.json").exists() and not (tmp_path / "verdict.txt").exists()


def test_the_help_gives_the_range_of_last(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "the last N runs, 1 to 1000" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("key", ["last", "min_runs"])
def test_history_last_outside_1_to_1000_is_refused(tmp_path: Path, key: str) -> None:
    refs = tmp_path / "refs.yaml"
    refs.write_text(f"history: {{{key}: 99999999999999999999}}\n")
    result = run("check", str(run_of(tmp_path, "r")), "--references", str(refs), "--system",
                 "s:p", "--history", str(tmp_path / "history"), *outputs(tmp_path))
    refused(result, "check", f"--references: {refs}: history.{key}: 99999999999999999999 is "
            "not a whole number from 1 to 1000")
    assert not (tmp_path / "history").exists() and not (tmp_path / "verdict.json").exists()


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("summary") / "summary"
    aggregate([FIXTURES / "collectives"], out)
    return out


def with_samples(summary: Path, folder: Path, text: str, row: int = 2) -> tuple[Path, str]:
    """A copy of ``summary`` whose row ``row`` has ``text`` as its samples; its folder and
    that row's point."""
    shutil.copytree(summary, folder)
    points = pd.read_parquet(folder / "summary.parquet")
    points.loc[row, "samples"] = text
    points.to_parquet(folder / "summary.parquet")
    return folder, points.loc[row, "point"]


@pytest.mark.parametrize(("text", "why"), [
    ("[1.0, oops", "'[1.0, oops' is not JSON (Expecting value"),
    ('{"latency_us.avg": ["x"]}', """'{"latency_us.avg": ["x"]}' is not a JSON object of metric"""),
    ("[1.0, 2.0]", "'[1.0, 2.0]' is not a JSON object of metric -> list of finite numbers"),
])
def test_corrupt_summary_samples_are_refused_by_check_and_report(summary: Path,
                                                                 tmp_path: Path, refs: Path,
                                                                 text: str, why: str) -> None:
    folder, point = with_samples(summary, tmp_path / "bad", text)
    where = f"SUMMARY: {folder / 'summary.parquet'}: row 2 (point {point}): samples: {why}"
    history = tmp_path / "history"
    refused(run("check", str(folder), "--references", str(refs), "--system", "s:p",
                "--history", str(history), *outputs(tmp_path)), "check", where)
    assert not history.exists() and not (tmp_path / "verdict.json").exists()
    report = tmp_path / "report.html"
    refused(run("report", str(folder), "--out", str(report)), "report", where)
    assert not report.exists()


@pytest.fixture(scope="module")
def verdict(summary: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A verdict file as `hpcmem check` writes it, of the fixtures' summary."""
    base = tmp_path_factory.mktemp("verdict")
    (base / "refs.yaml").write_text(HISTORY)
    assert run("check", str(summary), "--references", str(base / "refs.yaml"), "--system",
               "s:p", "--verdict-out", str(base / "v.json"))[0] == 0
    return json.loads((base / "v.json").read_text())


def _first_figure(**fields: object) -> Callable[[dict], None]:
    """A change of the verdict file's first figure to ``fields``."""

    def change(document: dict) -> None:
        document["figures"][0].update(fields)
    return change


@pytest.mark.parametrize(("change", "message"), [
    (lambda v: v.update(counts="abc"), "counts: 'abc' is not a mapping of verdict -> count"),
    (lambda v: v.update(counts={"PASS": "3"}), "counts: {'PASS': '3'} is not a mapping of"),
    (lambda v: v.update(counts={"PASS": 1}), "counts: {'PASS': 1} are not those of its "
     "figures (24 new)"),
    (lambda v: v.update(figures=[{"figure": "x"}]), "figures[0]: no field 'unit'"),
    (lambda v: v.update(figures="all"), "figures: 'all' is not a list"),
    (lambda v: v["figures"][0].pop("verdict"), "figures[0]: no field 'verdict'"),
    (_first_figure(verdict="WAT"), "figures[0]: verdict: 'WAT' is not one of PASS, FAIL"),
    (_first_figure(value="fast"), "figures[0]: value: 'fast' is not a number or null"),
    (_first_figure(note=None), "figures[0]: note: None is not text"),
    (lambda v: v.update(verdict="GREAT"), "verdict: 'GREAT' is not one of PASS, FAIL, UNJUDGED"),
])
def test_a_damaged_verdict_file_is_refused_by_report(summary: Path, verdict: dict,
                                                     tmp_path: Path,
                                                     change: Callable[[dict], None],
                                                     message: str) -> None:
    document = json.loads(json.dumps(verdict))
    change(document)
    path = tmp_path / "v.json"
    path.write_text(json.dumps(document))
    report = tmp_path / "report.html"
    refused(run("report", str(summary), "--verdict", str(path), "--out", str(report)),
            "report", f"--verdict: {path}: {message}")
    assert not report.exists()
