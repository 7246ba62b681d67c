"""Figures without a usable value are UNJUDGED, not PASS, and a check that judged nothing
fails (exit 1, saying so) unless ``--allow-unjudged``: in the table, the verdict file, the
terminal summary and the report, whose headline counts are the verdict file's."""

from __future__ import annotations

import io
import json
import re
import shutil
import sqlite3
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate

FIXTURES = Path(__file__).parent / "fixtures" / "records"
CHECKED = ("latency_us.avg", "busbw_GBps")
#: 12 points; bandwidth and latency checked at each
FIGURES = 24
NOTHING_JUDGED = ("hpcmem check: error: nothing judged: none of the summary's 24 checked "
                  "figures has a usable value (NaN, missing or not a number); "
                  "--allow-unjudged accepts such a run\n")


def run(*argv: str) -> tuple[int, str, str]:
    """``hpcmem ARGV`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("summary") / "summary"
    aggregate([FIXTURES / "collectives"], out)
    return out


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "refs.yaml"
    path.write_text("history: {last: 5}\n")
    return path


def changed(summary: Path, folder: Path, **columns: object) -> Path:
    """A copy of ``summary`` with ``columns`` set to these values in every row."""
    shutil.copytree(summary, folder)
    points = pd.read_parquet(folder / "summary.parquet")
    for name, value in columns.items():
        points[name] = value
    points.to_parquet(folder / "summary.parquet")
    return folder


def check(folder: Path, refs: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return run("check", str(folder), "--references", str(refs), "--system", "s:p",
               "--history", str(tmp_path / "history"),
               "--verdict-out", str(tmp_path / "verdict.json"), *extra)


def runs_in(history: Path) -> int:
    with sqlite3.connect(history / "history.sqlite") as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


def test_all_nan_figures_judge_nothing_and_fail(summary: Path, refs: Path, tmp_path: Path
                                                ) -> None:
    folder = changed(summary, tmp_path / "nan", **dict.fromkeys(CHECKED, np.nan))
    code, out, err = check(folder, refs, tmp_path)
    assert (code, err) == (1, NOTHING_JUDGED)
    assert out.splitlines()[-1].startswith(
        "# UNJUDGED: 0 pass, 0 fail, 0 noisy, 0 new, 0 missing, 24 unjudged; system s:p")
    assert out.count(" UNJUDGED  no value (NaN or missing): nothing to judge") == FIGURES
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["verdict"] == "UNJUDGED" and verdict["counts"]["UNJUDGED"] == FIGURES
    assert {f["verdict"] for f in verdict["figures"]} == {"UNJUDGED"}
    assert not (tmp_path / "history" / "history.sqlite").exists()  # nothing to append


def test_allow_unjudged_accepts_a_run_that_judged_nothing(summary: Path, refs: Path,
                                                          tmp_path: Path) -> None:
    folder = changed(summary, tmp_path / "nan", **dict.fromkeys(CHECKED, np.nan))
    code, out, err = check(folder, refs, tmp_path, "--allow-unjudged",
                           "--table-out", str(tmp_path / "verdict.txt"))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (f"hpcmem: UNJUDGED: 0 of {FIGURES} figures judged: 0 regressions, "
                        f"{FIGURES} unjudged (system s:p, run {_run_ids(summary)})")
    assert sum(line.startswith("  UNJUDGED collectives/") for line in lines) == 3
    assert lines[4] == f"  ... and {FIGURES - 3} more UNJUDGED (see the full table)"
    assert json.loads((tmp_path / "verdict.json").read_text())["verdict"] == "UNJUDGED"


def _run_ids(summary: Path) -> str:
    return "+".join(sorted(json.loads((summary / "metadata.json").read_text())["run_ids"]))


def test_the_help_names_the_option_and_the_exit_status(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--allow-unjudged exit 0, not 1, when no figure could be judged" in text
    assert "no figure was judged at all" in text


def test_text_figures_are_unjudged_and_the_rest_judged(summary: Path, refs: Path,
                                                       tmp_path: Path) -> None:
    points = pd.read_parquet(summary / "summary.parquet")
    text = points["busbw_GBps"].map(lambda v: f"{v} GB/s")  # not numbers: unparsable
    folder = changed(summary, tmp_path / "text", busbw_GBps=text)
    code, out, err = check(folder, refs, tmp_path)
    assert (code, err) == (0, "")
    assert re.search(r"size=65536/busbw_GBps +- .* UNJUDGED  value '10.082462 GB/s' is not a "
                     "finite number: nothing to judge", out)
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["verdict"] == "PASS"
    assert verdict["counts"] == {"PASS": 0, "FAIL": 0, "NOISY": 0, "NEW": 12, "MISSING": 0,
                                 "UNJUDGED": 12}
    with sqlite3.connect(tmp_path / "history" / "history.sqlite") as db:  # judged ones only
        stored = {row[0].rsplit("/", 1)[1] for row in db.execute("SELECT figure FROM figures")}
    assert stored == {"latency_us.avg"}


def test_a_referenced_nan_figure_is_unjudged_not_missing(summary: Path, tmp_path: Path
                                                         ) -> None:
    figure = "collectives/allreduce/hbw/float32/ranks=2/binding=cores/size=8/latency_us.avg"
    refs = tmp_path / "refs.yaml"
    refs.write_text(f"references:\n  '*:*':\n    '{figure}': [1.0, -0.5, 0.5, us]\n"
                    "    'collectives/*/native_latency_us.avg': [1.0, -0.5, 0.5, us]\n")
    points = pd.read_parquet(summary / "summary.parquet")
    latency = points["latency_us.avg"].where(~points["point"].eq(figure.rsplit("/", 1)[0]))
    code, out, _ = check(changed(summary, tmp_path / "one", **{"latency_us.avg": latency}),
                         refs, tmp_path)
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.startswith(figure)]
    assert "[0.5, 1.5]" in row and " UNJUDGED " in row  # its reference is shown with it
    # the native loop's latency is optional: the points lack it, so it is no figure of theirs
    assert "native_latency_us" not in out
    assert runs_in(tmp_path / "history") == 1


def test_a_summary_without_points_judges_nothing(refs: Path, tmp_path: Path) -> None:
    lines = (FIXTURES / "problems" / "problems.jsonl").read_text().splitlines()
    (tmp_path / "r.jsonl").write_text("".join(line + "\n" for line in lines
                                              if '"status": "skipped"' in line))
    aggregate([tmp_path / "r.jsonl"], tmp_path / "s")
    code, _, err = check(tmp_path / "s", refs, tmp_path)
    assert (code, err) == (1, "hpcmem check: error: nothing judged: the summary has no checked "
                              "figure; --allow-unjudged accepts such a run\n")
    assert check(tmp_path / "s", refs, tmp_path, "--allow-unjudged")[0] == 0


def test_the_report_shows_unjudged_figures_with_the_verdict_files_counts(
        summary: Path, refs: Path, tmp_path: Path) -> None:
    folder = changed(summary, tmp_path / "nan", **dict.fromkeys(CHECKED, np.nan))
    assert check(folder, refs, tmp_path)[0] == 1
    report = tmp_path / "report.html"
    assert run("report", str(folder), "--verdict", str(tmp_path / "verdict.json"),
               "--out", str(report))[0] == 0
    page = report.read_text()
    counts = json.loads((tmp_path / "verdict.json").read_text())["counts"]
    assert counts["UNJUDGED"] == sum(counts.values())
    assert (f'<span class="badge UNJUDGED">UNJUDGED</span> 0 of {counts["UNJUDGED"]} figures '
            f'judged: 0 regressions, {counts["UNJUDGED"]} unjudged — system') in page
    assert "Failures, noisy, missing and unjudged figures" in page
    assert page.count('<span class="badge UNJUDGED">UNJUDGED</span>') == 1 + 2 * FIGURES + 1


def test_the_real_cli_exits_1_on_nothing_judged_without_a_traceback(
        hpcmem_exe: str, summary: Path, refs: Path, tmp_path: Path) -> None:
    folder = changed(summary, tmp_path / "nan", **dict.fromkeys(CHECKED, np.nan))
    done = subprocess.run([hpcmem_exe, "check", str(folder), "--references", str(refs),
                           "--system", "s:p"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (1, NOTHING_JUDGED)
    assert "# UNJUDGED: " in done.stdout
