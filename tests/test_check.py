"""hpcmem check on recorded fixtures: tolerances both ways, history medians, bad input."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import yaml

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate

FIXTURES = Path(__file__).parent / "fixtures" / "records"
REPO = Path(__file__).resolve().parents[1]
HBW8 = "collectives/allreduce/hbw/float32/ranks=2/binding=cores/size=8"
NUMPY8 = HBW8.replace("/hbw/", "/numpy/")
BUSBW64K = "collectives/bcast/hbw/float32/ranks=2/binding=cores/size=65536/busbw_GBps"
CNN = "train/cnn/params=25557032/batch=256/seq=none/fp32/budget=none/policy="


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-made collectives and training fixtures, aggregated (no problem records)."""
    out = tmp_path_factory.mktemp("summary")
    aggregate([FIXTURES / "collectives", FIXTURES / "train"], out)
    return out


def write_refs(path: Path, figures: dict, history: dict | None = None,
               system: str = "*:*") -> Path:
    data = {"references": {system: figures}}
    if history is not None:
        data["history"] = history
    path.write_text(yaml.safe_dump(data))
    return path


def run_check(summary: Path, refs: Path, *extra: str, system: str | None = "site:part"
              ) -> tuple[int, str, str]:
    """``hpcmem check`` for ``system`` (None: without --system)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    out, err = io.StringIO(), io.StringIO()
    option = ["--system", system] if system else []
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check", str(summary), "--references", str(refs), *option, *extra])
    return code, out.getvalue(), err.getvalue()


def row_of(table: str, figure: str) -> str:
    rows = [line for line in table.splitlines() if line.startswith(figure + " ")]
    assert len(rows) == 1, table
    return rows[0]


def test_within_tolerance_passes(summary: Path, tmp_path: Path) -> None:
    refs = write_refs(tmp_path / "r.yaml", {
        f"{HBW8}/latency_us.avg": [1.05, -0.1, 0.1, "us"],      # median 1.00
        "collectives/*/size=65536/busbw_GBps": [8.0, -0.5, 0.5, "GB/s"],
        f"{CNN}hpcmem/step_ms.median": [84.5, -0.05, 0.05, "ms"],
    })
    code, out, err = run_check(summary, refs)
    assert (code, err) == (0, "")
    assert row_of(out, f"{HBW8}/latency_us.avg").split()[-1] == "PASS"
    assert "PASS" in row_of(out, BUSBW64K)
    assert "PASS" in row_of(out, f"{CNN}hpcmem/step_ms.median")
    assert out.splitlines()[-1].startswith("# PASS: ")


@pytest.mark.parametrize(
    ("figure", "reference", "words"),
    [
        # latency 1.00 us; reference 0.5 +-10%: too slow
        (f"{HBW8}/latency_us.avg", [0.5, -0.1, 0.1, "us"], "slower than the reference (above"),
        # latency 1.2 us (repeats 1.1 to 1.3); reference 2.4 +-10%: suspiciously fast
        (f"{NUMPY8}/latency_us.avg", [2.4, -0.1, 0.1, "us"], "suspiciously faster than the ref"),
        # bandwidth 10.08 GB/s; reference 5 +-10%: suspiciously fast (higher is better)
        (BUSBW64K, [5.0, -0.1, 0.1, "GB/s"], "suspiciously faster than the reference (above"),
        # bandwidth 10.08 GB/s; reference 20: too slow
        (BUSBW64K, [20.0, -0.1, 0.1, "GB/s"], "slower than the reference (below"),
        # step time 133 ms for um against 100 ms +5%: too slow
        (f"{CNN}um/step_ms.median", [100.0, None, 0.05, "ms"], "slower than the reference"),
    ],
)
def test_regressions_in_both_directions_fail(summary: Path, tmp_path: Path, figure: str,
                                             reference: list, words: str) -> None:
    refs = write_refs(tmp_path / "r.yaml", {figure: reference})
    code, out, _ = run_check(summary, refs)
    assert code == 1
    row = row_of(out, figure)
    assert " FAIL " in row and words in row
    assert out.splitlines()[-1].startswith("# FAIL: 0 pass, 1 fail")


def test_a_point_whose_repeats_disagree_is_noisy_not_failed(summary: Path, tmp_path: Path
                                                           ) -> None:
    # repeats 0.9, 1.0 and 50 us (median 1.0): below the band 1.8..2.2, but one repeat above
    refs = write_refs(tmp_path / "r.yaml", {f"{HBW8}/latency_us.avg": [2.0, -0.1, 0.1, "us"]})
    code, out, _ = run_check(summary, refs)
    row = row_of(out, f"{HBW8}/latency_us.avg")
    assert code == 0 and " NOISY " in row and "repeats spread 4910% of their median" in row
    assert "1 noisy" in out.splitlines()[-1]
    # every repeat above the band 0.45..0.55: slower whatever the spread
    refs = write_refs(tmp_path / "r.yaml", {f"{HBW8}/latency_us.avg": [0.5, -0.1, 0.1, "us"]})
    assert run_check(summary, refs)[0] == 1


def test_open_bound_accepts_any_improvement(summary: Path, tmp_path: Path) -> None:
    refs = write_refs(tmp_path / "r.yaml", {f"{HBW8}/latency_us.avg": [5.0, None, 0.1, "us"]})
    assert run_check(summary, refs)[0] == 0


def test_system_lookup_prefers_the_exact_partition(summary: Path, tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"references": {
        "*:*": {f"{HBW8}/latency_us.avg": [0.1, -0.1, 0.1, "us"]},
        "site:*": {f"{HBW8}/latency_us.avg": [0.2, -0.1, 0.1, "us"]},
        "site:part": {"collectives/*/latency_us.avg": [1.0, -0.1, 0.1, "us"]},
    }}))
    code, out, _ = run_check(summary, path)
    assert "PASS" in row_of(out, f"{HBW8}/latency_us.avg")
    assert code == 1  # other latencies, matched by the site:part pattern, are far from 1.0


def test_each_point_is_judged_for_the_partition_it_ran_in(tmp_path: Path, monkeypatch) -> None:
    # hbw points measured in Slurm partition lab:hbm, numpy points in lab:batch
    records = tmp_path / "records"
    records.mkdir()
    for source in (FIXTURES / "collectives").glob("*.jsonl"):
        lines = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        for record in lines:
            record["system"] = "lab:hbm" if record["buffer"] == "hbw" else "lab:batch"
        (records / source.name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    aggregate([records], tmp_path / "s")
    refs = tmp_path / "r.yaml"
    refs.write_text(yaml.safe_dump({"references": {
        "*:*": {"collectives/*/size=8/latency_us.avg": [100.0, -0.1, 0.1, "us"]},
        "lab:hbm": {f"{HBW8}/latency_us.avg": [1.0, -0.1, 0.1, "us"]},
    }}))
    monkeypatch.delenv("HPCMEM_SYSTEM", raising=False)
    for variable in ("SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION"):
        monkeypatch.delenv(variable, raising=False)
    code, out, _ = run_check(tmp_path / "s", refs, "--history", str(tmp_path / "h"), system=None)
    assert "PASS" in row_of(out, f"{HBW8}/latency_us.avg")  # lab:hbm's reference applied
    numpy8 = HBW8.replace("/hbw/", "/numpy/")
    assert "FAIL" in row_of(out, f"{numpy8}/latency_us.avg")  # lab:batch falls back to *:*
    assert code == 1 and "run fixture" in out.splitlines()[-1]
    assert "system lab:batch,lab:hbm" in out.splitlines()[-1]
    with sqlite3.connect(tmp_path / "h" / "history.sqlite") as db:
        systems = {row[0] for row in db.execute("SELECT system FROM runs")}
        (hbm_figures,) = db.execute("SELECT count(*) FROM figures WHERE system = 'lab:hbm' "
                                    "AND figure LIKE '%/numpy/%'").fetchone()
    assert systems == {"lab:batch", "lab:hbm"} and hbm_figures == 0
    # --system still applies one system to every point
    code, out, _ = run_check(tmp_path / "s", refs)
    assert "system site:part" in out.splitlines()[-1]


def test_failed_points_invalid_records_and_missing_references(tmp_path: Path) -> None:
    aggregate([FIXTURES / "collectives", FIXTURES / "problems"], tmp_path / "s")
    refs = write_refs(tmp_path / "r.yaml", {
        "collectives/gather/numpy/float32/ranks=2/binding=cores/size=8/latency_us.avg":
            [1.0, -0.5, 0.5, "us"],
    })
    code, out, _ = run_check(tmp_path / "s", refs, "--verdict-out", str(tmp_path / "v.json"))
    assert code == 1
    failed = "collectives/allreduce/hbw_preferred/float32/ranks=2/binding=cores/size=1024/status"
    assert "point failed: allreduce 1024 B: result differs" in row_of(out, failed)
    assert "invalid record: latency_us: 'max'" in row_of(out, f"record {FIXTURES}/problems/"
                                                         "problems.jsonl:4")
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert verdict["verdict"] == "FAIL"
    assert verdict["counts"] == {"PASS": 0, "FAIL": 4, "NOISY": 0, "NEW": 24, "MISSING": 1,
                                 "UNJUDGED": 0}
    missing = [f for f in verdict["figures"] if f["verdict"] == "MISSING"]
    assert missing[0]["figure"].startswith("collectives/gather/numpy")


def _run_with_scale(tmp_path: Path, run_id: str, scale: float, day: int) -> Path:
    """The collectives fixtures as a new run whose latencies are ``scale`` x the recorded ones."""
    folder = tmp_path / run_id
    folder.mkdir()
    lines = []
    for path in sorted((FIXTURES / "collectives").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            record["run_id"] = run_id
            record["timestamp"] = f"2026-11-{day:02d}T02:00:00+00:00"
            record["latency_us"] = {k: v * scale for k, v in record["latency_us"].items()}
            lines.append(json.dumps(record))
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    aggregate([folder], folder / "summary")
    return folder / "summary"


def test_history_median_comparison_and_idempotent_append(tmp_path: Path) -> None:
    refs = write_refs(tmp_path / "r.yaml", {}, history={"last": 3, "lower": -0.2, "upper": 0.2})
    history = tmp_path / "history"
    figure = f"{HBW8}/latency_us.avg"  # 1.00 us at scale 1
    for day, scale in enumerate([1.0, 1.1, 0.9, 1.05], start=1):
        code, out, _ = run_check(_run_with_scale(tmp_path, f"run{day}", scale, day), refs,
                                 "--history", str(history))
        assert code == 0, out
        if day == 3:  # two runs in the history, min_runs is 3 (the default): shown, not judged
            row = row_of(out, figure)
            assert "1.05 (n=2)" in row and " NEW " in row
            assert "history of 2 runs, fewer than min_runs 3: not judged" in row
    # last 3 runs before run5: scales 1.1, 0.9, 1.05 -> median 1.05 us
    slow = _run_with_scale(tmp_path, "run5", 1.5, 5)
    code, out, _ = run_check(slow, refs, "--history", str(history))
    row = row_of(out, figure)
    assert code == 1
    assert "1.05 (n=3)" in row and "slower than the history" in row and "+43% vs median" in row
    # checking the same run again compares with the same history and appends nothing
    code_again, out_again, _ = run_check(slow, refs, "--history", str(history))
    assert (code_again, row_of(out_again, figure)) == (code, row)
    with sqlite3.connect(history / "history.sqlite") as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 5
        figures_of_run5 = db.execute(
            "SELECT count(*) FROM figures WHERE run_id = 'run5'").fetchone()[0]
    assert figures_of_run5 == 24
    # run5 was appended too (a regression is history as well); --last 1 takes it alone,
    # and a suspiciously fast run fails the other way
    fast = _run_with_scale(tmp_path, "run6", 0.5, 6)
    code, out, _ = run_check(fast, refs, "--history", str(history), "--last", "1",
                             "--no-append")
    assert code == 1
    row = row_of(out, figure)
    assert "1.5 (n=1)" in row and "-67% vs median" in row
    assert "suspiciously faster than the history" in row


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("references: {'*:*': {}}\nthresholds: {}\n", "unknown key 'thresholds'"),
        ("references:\n  '*:*':\n    'collectives/*/latency': [1, -0.1, 0.1, us]\n",
         "unknown metric 'latency'"),
        ("references:\n  '*:*':\n    'collectives/*/latency_us.avg': [1, -0.1, 0.1, ms]\n",
         "(unit): 'ms' is not this figure's unit 'us'"),
        ("references:\n  '*:*':\n    'collectives/*/latency_us.avg': [1, 0.1, 0.2, us]\n",
         "(lower): 0.1 must lie in [-1, 0]"),
        ("references:\n  '*:*':\n    'collectives/*/latency_us.avg': [fast, -0.1, 0.1, us]\n",
         "(target): 'fast' is not a number"),
        ("references:\n  '*:*':\n    'collectives/*/latency_us.avg': 1.0\n",
         "is not [target, lower, upper, unit]"),
        ("references:\n  cluster:\n    'collectives/*/latency_us.avg': [1, -0.1, 0.1, us]\n",
         "key 'cluster' is not 'system:partition'"),
        ("history: {last: 0}\n", "history.last: 0 is not a whole number from 1 to 1000"),
        ("history: {min_runs: 2.5}\n", "history.min_runs: 2.5 is not a whole number from 1"),
        ("history: {median: 3}\n", "history: unknown key 'median'"),
        ("references: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_references_exit_2_naming_the_field(summary: Path, tmp_path: Path, content: str,
                                                message: str) -> None:
    refs = tmp_path / "r.yaml"
    refs.write_text(content)
    code, out, err = run_check(summary, refs)
    assert code == 2 and out == ""
    assert err.startswith(f"hpcmem check: error: --references: {refs}")
    assert message in err and len(err.strip().splitlines()) == 1


def test_bad_summary_and_options_exit_2(summary: Path, tmp_path: Path) -> None:
    refs = write_refs(tmp_path / "r.yaml", {}, history={"last": 5})
    code, _, err = run_check(tmp_path / "nowhere", refs)
    assert code == 2 and "SUMMARY:" in err and "no summary.parquet" in err
    code, _, err = run_check(summary, refs, "--last", "0")
    assert code == 2 and "--last: 0" in err
    code, _, err = run_check(summary, refs, "--system", "nopartition")
    assert code == 2 and "--system: 'nopartition' is not NAME:PARTITION" in err
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "history.sqlite").write_text("not a database\n" * 100)
    code, _, err = run_check(summary, refs, "--history", str(tmp_path / "history"))
    assert code == 2 and "not a usable history store (file is not a database)" in err


def test_shipped_references_leave_collectives_to_the_history(summary: Path,
                                                             tmp_path: Path) -> None:
    """No band for every machine: a first run is new, and the history's band catches a 2x
    slowdown once it holds history.min_runs runs."""
    shipped = REPO / "config" / "references.yaml"
    code, out, err = run_check(summary, shipped)
    assert err == "" and code == 0
    assert row_of(out, f"{HBW8}/latency_us.avg").endswith(" NEW")
    assert re.search(r"^# PASS: 0 pass, 0 fail, 0 noisy, \d+ new, 0 missing", out, re.M)
    for day in range(1, 4):
        run_check(_run_with_scale(tmp_path, f"run{day}", 1.0 + day / 100, day), shipped,
                  "--history", str(tmp_path / "history"))
    code, out, _ = run_check(_run_with_scale(tmp_path, "slow", 2.0, 4), shipped,
                             "--history", str(tmp_path / "history"))
    slower = [line for line in out.splitlines() if "slower than the history" in line]
    assert code == 1 and slower and all(" FAIL " in line or " NOISY " in line
                                        for line in slower)
    assert sum(" FAIL " in line for line in slower) >= len(slower) // 2, out


def test_a_nan_latency_is_a_failure_not_a_vanished_point(tmp_path: Path) -> None:
    record = json.loads((FIXTURES / "collectives" / "rep1.jsonl").open().readline())
    text = json.dumps(record)
    nan = text.replace(f'"avg": {record["latency_us"]["avg"]}', '"avg": NaN')
    (tmp_path / "r.jsonl").write_text(nan + "\n")
    assert main(["aggregate", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "s")]) == 0
    refs = write_refs(tmp_path / "r.yaml", {"collectives/*/latency_us.avg": [1.0, -0.5, 0.5, "us"]})
    code, out, _ = run_check(tmp_path / "s", refs)
    assert code == 1
    assert "non-finite number NaN is not accepted" in out and "# FAIL: 0 pass, 1 fail" in out
