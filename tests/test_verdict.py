"""The statistical verdict: rank test, spread, node state, NOISY beside PASS and FAIL.

Runs of one collectives point are written as records with explicit repeats (the fixture
record of ``tests/fixtures/records/collectives`` with its latencies replaced), aggregated
and checked with ``hpcmem check``, as the workflow does.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate
from hpcmem.results.ranktest import mann_whitney_p, smallest_p
from hpcmem.results.references import ReferencesError, parse_references
from hpcmem.results.verdict import summary_lines

FIXTURE = Path(__file__).parent / "fixtures" / "records" / "collectives" / "rep1.jsonl"
FIGURE = "collectives/allreduce/numpy/float32/ranks=2/binding=cores/size=8/latency_us.avg"
#: three quiet runs of three repeats, all distinct (ties would leave the exact test)
QUIET = [[1.00, 1.04, 0.97], [0.98, 1.02, 1.01], [1.03, 0.99, 1.005]]


def point_run(tmp_path: Path, run_id: str, day: int, latencies: list[float],
              shared: bool | None = False) -> Path:
    """A run of the fixture's allreduce 8 B point with these repeats; its summary folder."""
    record = json.loads(FIXTURE.read_text().splitlines()[0])
    repeats = [{"latency_us": {"avg": v, "min": v * 0.9, "max": v * 1.1}} for v in latencies]
    ordered = sorted(latencies)
    record.update(run_id=run_id, timestamp=f"2026-11-{day:02d}T02:00:00+00:00",
                  repeats=repeats, latency_us=repeats[latencies.index(ordered[len(ordered) // 2])]
                  ["latency_us"])
    record["node"] = {"cpus": 2, "processes": 2, "load_before": None, "load_after": None,
                      "other_busy_cpus": 1.0 if shared else 0.0, "shared_cores": shared,
                      "governor": None, "yield_when_idle": False}
    folder = tmp_path / run_id
    folder.mkdir(parents=True)
    (folder / "r.jsonl").write_text(json.dumps(record) + "\n")
    aggregate([folder], folder / "summary")
    return folder / "summary"


def check(summary: Path, refs: Path, history: Path, *extra: str) -> tuple[int, str]:
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["check", str(summary), "--references", str(refs), "--system", "lab:p",
                     "--history", str(history), *extra])
    return code, out.getvalue()


def verdict_row(table: str) -> str:
    (row,) = [line for line in table.splitlines() if line.startswith(FIGURE + " ")]
    return row


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump({"history": {"last": 5, "min_runs": 3, "lower": -0.5,
                                                "upper": 0.5}}))
    return path


def history_of(tmp_path: Path, refs: Path, runs: list[list[float]], shared: bool = False
               ) -> Path:
    history = tmp_path / "history"
    for day, latencies in enumerate(runs, 1):
        summary = point_run(tmp_path, f"base{day}", day, latencies, shared)
        assert check(summary, refs, history)[0] == 0
    return history


def test_a_significant_slowdown_beyond_tolerance_fails(tmp_path: Path, refs: Path) -> None:
    history = history_of(tmp_path, refs, QUIET)
    code, out = check(point_run(tmp_path, "slow", 9, [2.0, 2.1, 1.95]), refs, history)
    row = verdict_row(out)
    assert code == 1 and " FAIL " in row
    assert "+99% vs median (p=0.0091, 3 against 9 samples)" in row


def test_beyond_tolerance_but_not_significant_is_noisy(tmp_path: Path, refs: Path) -> None:
    # the history's repeats reach 2 us too: a median of 1.6 us cannot be told from them
    history = history_of(tmp_path, refs, [[1.0, 2.0, 1.05], [1.02, 1.9, 1.0], [0.98, 2.1, 1.04]])
    code, out = check(point_run(tmp_path, "run", 9, [1.6, 1.7, 1.55]), refs, history)
    row = verdict_row(out)
    assert code == 0 and " NOISY " in row and "not significant (p=" in row


def test_repeats_that_disagree_are_noisy_unless_all_of_them_are_slow(tmp_path: Path,
                                                                     refs: Path) -> None:
    history = history_of(tmp_path, refs, QUIET)
    code, out = check(point_run(tmp_path, "spread", 9, [1.2, 2.0, 9.0]), refs, history,
                      "--no-append")
    assert code == 0 and "repeats spread 390% of their median" in verdict_row(out)
    code, out = check(point_run(tmp_path, "slow", 10, [2.0, 3.0, 9.0]), refs, history)
    assert code == 1 and " FAIL " in verdict_row(out)


def test_shared_cores_explain_a_slowdown_only_against_a_quiet_history(tmp_path: Path,
                                                                      refs: Path) -> None:
    quiet = history_of(tmp_path / "q", refs, QUIET)
    busy_run = [1.45, 1.6, 1.65]  # median beyond the band (1.51 us), one repeat inside it
    code, out = check(point_run(tmp_path, "busy", 9, busy_run, shared=True), refs, quiet,
                      "--no-append")
    assert code == 0 and "shared cores with other work, the history's runs did not" in (
        verdict_row(out))
    # a slowdown every repeat shows is a change, busy node or not
    code, out = check(point_run(tmp_path, "slow", 10, [1.6, 1.7, 1.65], shared=True), refs,
                      quiet)
    assert code == 1 and " FAIL " in verdict_row(out)
    # against a history measured beside the same load, the first run is a regression too
    busy = history_of(tmp_path / "b", refs, QUIET, shared=True)
    code, out = check(point_run(tmp_path, "busy2", 9, busy_run, shared=True), refs, busy)
    assert code == 1 and " FAIL " in verdict_row(out)


def test_faster_than_a_history_that_shared_cores_is_noisy_when_it_shares_them_too(
        tmp_path: Path, refs: Path) -> None:
    fast = [0.40, 0.42, 0.41]  # every repeat 2.4x faster: less contention, not a change
    busy = history_of(tmp_path / "b", refs, QUIET, shared=True)
    code, out = check(point_run(tmp_path, "busy", 9, fast, shared=True), refs, busy,
                      "--no-append")
    assert code == 0 and " NOISY " in verdict_row(out)
    assert ("the point and 3 of the history's 3 runs shared cores with other work: less "
            "contention reads as faster") in verdict_row(out)
    # against a quiet history, judged as any change
    quiet = history_of(tmp_path / "q", refs, QUIET)
    code, out = check(point_run(tmp_path, "busy2", 11, fast, shared=True), refs, quiet)
    assert code == 1 and " FAIL " in verdict_row(out)


def test_references_excuse_shared_cores_unless_told_to_judge(tmp_path: Path) -> None:
    summary = point_run(tmp_path, "run", 1, [5.0, 5.1, 4.9], shared=True)
    path = tmp_path / "r.yaml"
    for setting, code_wanted, verdict in (("noisy", 0, " NOISY "), ("judge", 1, " FAIL ")):
        path.write_text(yaml.safe_dump({
            "history": {"shared_cores": setting},
            "references": {"*:*": {FIGURE: [1.0, -0.5, 0.5, "us"]}}}))
        code, out = check(summary, path, tmp_path / f"h-{setting}")
        assert code == code_wanted and verdict in verdict_row(out)


def test_a_history_without_samples_gains_them_and_still_judges(tmp_path: Path,
                                                               refs: Path) -> None:
    history = tmp_path / "history"
    history.mkdir()
    with sqlite3.connect(history / "history.sqlite") as db:  # as the first version made it
        db.executescript("""
            CREATE TABLE runs (run_id TEXT NOT NULL, system TEXT NOT NULL, timestamp TEXT,
              checked_at TEXT NOT NULL, git_sha TEXT, hosts TEXT, hpcmem_version TEXT,
              container TEXT, slurm_job_ids TEXT, verdict TEXT NOT NULL,
              PRIMARY KEY (run_id, system));
            CREATE TABLE figures (run_id TEXT NOT NULL, system TEXT NOT NULL,
              figure TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL,
              PRIMARY KEY (run_id, system, figure));""")
        for day in (1, 2, 3):
            db.execute("INSERT INTO runs VALUES (?, 'lab:p', ?, 'x', NULL, '[]', NULL, 'null',"
                       " '[]', 'PASS')", (f"old{day}", f"2026-11-0{day}"))
            db.execute("INSERT INTO figures VALUES (?, 'lab:p', ?, 1.0, 'us')",
                       (f"old{day}", FIGURE))
    code, out = check(point_run(tmp_path, "new", 9, [3.0, 3.1, 2.9]), refs, history)
    # one sample per old run: too few for a rank test, judged on the tolerance alone
    assert code == 1 and "3 against 3 samples: too few for a rank test" in verdict_row(out)


def test_table_out_keeps_the_table_and_prints_a_short_summary(tmp_path: Path,
                                                             refs: Path) -> None:
    history = history_of(tmp_path, refs, QUIET)
    table = tmp_path / "verdict.txt"
    code, out = check(point_run(tmp_path, "slow", 9, [2.0, 2.1, 1.95]), refs, history,
                      "--table-out", str(table))
    assert code == 1 and " FAIL " in verdict_row(table.read_text())
    assert out.splitlines() == [
        "hpcmem: FAIL: 2 of 2 figures judged (2 against history): 1 regression "
        "(system lab:p, run slow)",
        f"  FAIL {FIGURE}: slower than the history (above the upper bound): +99% vs median "
        "(p=0.0091, 3 against 9 samples)",
        f"hpcmem: verdict {table} (every figure)"]


@pytest.mark.parametrize(("m", "n"), [(1, 1), (2, 3), (3, 3), (3, 5), (4, 4)])
def test_the_exact_rank_test_matches_counting_every_ordering(m: int, n: int) -> None:
    values = [0.11, 0.52, 0.23, 0.94, 0.35, 0.76, 0.47, 0.18]
    x, y = values[:m], values[m:m + n]

    def u(a: list[float], b: list[float]) -> int:
        return sum(i > j for i in a for j in b)

    centre, pooled = m * n / 2, [*x, *y]
    splits = list(itertools.combinations(range(m + n), m))
    extreme = sum(
        abs(u([pooled[i] for i in chosen], [pooled[i] for i in range(m + n) if i not in chosen])
            - centre) >= abs(u(x, y) - centre)
        for chosen in splits)
    assert mann_whitney_p(x, y) == pytest.approx(extreme / len(splits))
    assert smallest_p(m, n) == pytest.approx(min(1.0, 2 / len(splits)))


def test_the_normal_approximation_for_large_samples() -> None:
    x = [float(v) for v in range(30)]
    assert mann_whitney_p(x, [v + 100 for v in x]) < 1e-9  # apart: certain
    assert mann_whitney_p(x, [v + 0.5 for v in x]) > 0.5  # interleaved: no evidence
    assert mann_whitney_p([1.0, 1.0, 2.0], [1.0, 1.0, 2.0]) == 1.0  # ties


def test_the_terminal_summary_stays_short() -> None:
    figures = [{"figure": f"f{i}", "verdict": "FAIL" if i % 2 else "NOISY", "note": "x" * 300}
               for i in range(200)]
    lines = summary_lines({"verdict": "FAIL", "counts": {"FAIL": 100, "NOISY": 100},
                           "figures": figures, "system": "s:p", "run_id": "r"},
                          report="/r.html", table="/v.txt")
    assert len(lines) <= 20 and lines[0].startswith(
        "hpcmem: FAIL: 100 of 200 figures judged (100 from failed points or records): "
        "100 regressions, 100 noisy")
    assert "... and 94 more FAIL" in "\n".join(lines) and max(map(len, lines)) < 140


@pytest.mark.parametrize(("history", "message"), [
    ({"alpha": 1.5}, "history.alpha: 1.5 must lie in (0, 1)"),
    ({"alpha": "low"}, "history.alpha: 'low' is not a number"),
    ({"max_spread": 0}, "history.max_spread: 0.0 must be > 0"),
    ({"shared_cores": "ignore"}, "history.shared_cores: 'ignore' is not one of noisy, judge"),
])
def test_bad_judging_settings_are_refused_naming_them(history: dict, message: str) -> None:
    with pytest.raises(ReferencesError) as error:
        parse_references({"history": history}, "r.yaml")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_speedup_of_a_noisy_point_is_marked_not_a_speedup(tmp_path: Path) -> None:
    from hpcmem.collectives.tables import latency_range, speedup_table
    from hpcmem.results.summary import read_summary

    aggregate([FIXTURE.parent], tmp_path / "s")
    points = read_summary(tmp_path / "s").points
    spans = latency_range(points).set_index(points["point"])
    hbw8 = FIGURE.replace("/numpy/", "/hbw/").rsplit("/", 1)[0]
    # the fixture's hbw allreduce at 8 B has repeats 0.9, 1.0 and 50 us
    assert spans.loc[hbw8].tolist() == [0.9, 50.0, pytest.approx(49.1)]
    speed = speedup_table(points)
    noisy = speed[speed["noisy"]]
    assert noisy[["op", "buffer", "size_bytes"]].values.tolist() == [["allreduce", "hbw", 8]]
