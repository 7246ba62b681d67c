"""The report's history section against the history store: each judged figure over its
last runs (values oldest first, the runs where it failed or was noisy), drawn and listed,
from the store the check kept; a damaged store is one line naming it, exit 2."""

from __future__ import annotations

import html
import json
import re
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_check import _run_with_scale, run_check

from hpcmem.cli import main

LAST = 4
#: latency scales of the runs, one a night: the fourth a slowdown (FAIL), then back
SCALES = [1.0, 1.1, 0.9, 1.6, 1.05]


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five nights checked against their own history; the folder of the last one."""
    base = tmp_path_factory.mktemp("nights")
    refs = base / "refs.yaml"
    refs.write_text(yaml.safe_dump({"references": {"*:*": {}}, "history": {
        "last": LAST, "min_runs": 2, "lower": -0.2, "upper": 0.2}}))
    for day, scale in enumerate(SCALES, start=1):
        summary = _run_with_scale(base, f"night{day}", scale, day)
        run_check(summary, refs, "--history", str(base / "history"), "--verdict-out",
                  str(base / f"night{day}" / "verdict.json"))
    last = base / f"night{len(SCALES)}"
    assert main(["report", str(last / "summary"), "--verdict", str(last / "verdict.json"),
                 "--out", str(last / "report.html")]) == 0
    return last


def listed(page: str) -> dict[str, list[str]]:
    """The history section's table: figure -> its cells."""
    section = re.search(r'<section id="history">(.*?)</section>', page, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>")[1], re.S)
    cells = [[html.unescape(re.sub(r"<[^>]+>", "", cell))
              for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]
    return {row[0]: row[1:] for row in cells}


def test_the_history_section_draws_each_judged_figure_as_the_store_has_it(
    nights: Path,
) -> None:
    page = (nights / "report.html").read_text()
    verdict = json.loads((nights / "verdict.json").read_text())
    judged = [f for f in verdict["figures"] if f["verdict"] in ("PASS", "FAIL", "NOISY")]
    table = listed(page)
    assert sorted(table) == sorted(f["figure"] for f in judged) and judged
    store = nights.parent / "history" / "history.sqlite"
    with sqlite3.connect(store) as db:
        runs = [run for (run,) in db.execute(
            "SELECT run_id FROM runs ORDER BY timestamp DESC LIMIT ?", (LAST,))][::-1]
        for figure in judged:
            stored = dict(db.execute(
                "SELECT run_id, value FROM figures WHERE figure = ?", (figure["figure"],)))
            verdicts = dict(db.execute(
                "SELECT run_id, verdict FROM figures WHERE figure = ?", (figure["figure"],)))
            verdict_cell, band, count, values, failed, noisy = table[figure["figure"]]
            kept = [run for run in runs if run in stored]
            assert verdict_cell == figure["verdict"] and int(count) == len(kept)
            median = figure["history_median"]  # this run's band: the history's +-20%
            assert band == f"[{median * 0.8:.4g}, {median * 1.2:.4g}]"
            assert values.split() == [f"{stored[run]:.4g}" for run in kept]
            for cell, which in ((failed, "FAIL"), (noisy, "NOISY")):
                assert cell == (", ".join(r for r in kept if verdicts[r] == which) or "-")
    assert runs == ["night2", "night3", "night4", "night5"]
    point = "collectives/allreduce/hbw/float32/ranks=2/binding=cores"
    assert table[f"{point}/size=1024/latency_us.avg"][4] == "night4"  # the slowdown failed
    assert table[f"{point}/size=8/latency_us.avg"][5] == "night4"  # its repeats spread: noisy
    assert 'alt="judged figures over their last runs"' in page


def test_a_damaged_history_store_is_named(nights: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "history"
    store.mkdir()
    (store / "history.sqlite").write_bytes(
        (nights.parent / "history" / "history.sqlite").read_bytes())
    with sqlite3.connect(store / "history.sqlite") as db:
        db.execute("UPDATE figures SET verdict = 'GREAT' WHERE run_id = 'night3'")
    verdict = json.loads((nights / "verdict.json").read_text())
    verdict["history"]["folder"] = str(store)
    (tmp_path / "verdict.json").write_text(json.dumps(verdict))
    out = tmp_path / "report.html"
    assert main(["report", str(nights / "summary"), "--verdict", str(tmp_path / "verdict.json"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpcmem report: error: --verdict: {store / 'history.sqlite'}: run "
                          "'night3' on ") and "verdict: 'GREAT' is not one of" in err
    assert not out.exists()
    verdict["history"] = "somewhere"
    (tmp_path / "verdict.json").write_text(json.dumps(verdict))
    assert main(["report", str(nights / "summary"), "--verdict", str(tmp_path / "verdict.json"),
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(
        "hpcmem report: error: --verdict: history: 'somewhere' is not a folder and a number")
    assert not out.exists()
