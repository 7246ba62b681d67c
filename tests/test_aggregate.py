"""hpcmem aggregate on recorded fixtures: medians, left-out records, atomic outputs, bad input."""

from __future__ import annotations

import json
import os
import stat
import statistics
from pathlib import Path

import pandas as pd
import pytest

from hpcmem.cli import main
from hpcmem.node.applied import binding_label
from hpcmem.results.aggregate import aggregate, load_records, summarize, write_outputs

FIXTURES = Path(__file__).parent / "fixtures" / "records"
OUTPUTS = {"summary.parquet", "summary.csv", "collectives_latency.csv", "collectives_speedup.csv",
           "train_step_time.csv", "peers_step_time.csv", "rejected.csv", "skipped.csv",
           "metadata.json"}
HBW8 = "collectives/allreduce/hbw/float32/ranks=2/binding=cores/size=8"
NUMPY8 = "collectives/allreduce/numpy/float32/ranks=2/binding=cores/size=8"
TRANSFORMER = "train/transformer/params=350000000/batch=8/seq=2048/bf16/budget=none/policy="


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """All hand-made fixtures (valid and problematic) aggregated once."""
    out = tmp_path_factory.mktemp("summary")
    inputs = [FIXTURES / "collectives", FIXTURES / "train", FIXTURES / "problems"]
    result = aggregate(inputs, out)
    return out, result.summary.set_index("point")


def test_medians_match_hand_computed_values(everything: tuple[Path, pd.DataFrame]) -> None:
    _, summary = everything
    # allreduce/hbw/8 B repeats: avg 1.00, 0.90, 50.0 (outlier); max 1.2, 1.08, 60.0
    assert summary.loc[HBW8, "latency_us.avg"] == pytest.approx(1.00)
    assert summary.loc[HBW8, "latency_us.max"] == pytest.approx(1.2)
    assert summary.loc[HBW8, "repeats"] == 3
    # allreduce/numpy/8 B: 1.10, 1.30, 1.20
    assert summary.loc[NUMPY8, "latency_us.avg"] == pytest.approx(1.20)
    # train: two repeats -> the mean of the two; p10 is 0.97 x step
    assert summary.loc[TRANSFORMER + "cuda", "step_ms.median"] == pytest.approx(102.0)
    assert summary.loc[TRANSFORMER + "um", "step_ms.median"] == pytest.approx(122.0)
    assert summary.loc[TRANSFORMER + "cuda", "step_ms.p10"] == pytest.approx(0.97 * 102.0)
    assert len(summary) == 12 + 6  # 2 ops x 2 buffers x 3 sizes + 2 models x 3 policies


def test_derived_tables(everything: tuple[Path, pd.DataFrame]) -> None:
    out, _ = everything
    latency = pd.read_csv(out / "collectives_latency.csv")
    row = latency[(latency["op"] == "bcast") & (latency["size_bytes"] == 65536)].iloc[0]
    assert (row["latency_us_numpy"], row["latency_us_hbw"]) == (9.0, 6.5)
    speed = pd.read_csv(out / "collectives_speedup.csv")
    row = speed[(speed["op"] == "allreduce") & (speed["size_bytes"] == 65536)].iloc[0]
    assert row["buffer"] == "hbw"
    assert row["speedup"] == pytest.approx(16.0 / 12.0)
    steps = pd.read_csv(out / "train_step_time.csv").set_index(["model", "policy"])
    assert steps.loc[("transformer", "hpcmem"), "ratio_to_um"] == pytest.approx(102.0 / 122.0)
    assert steps.loc[("cnn", "um"), "ratio_to_cuda"] == pytest.approx(133.0 / 85.0)
    assert steps.loc[("cnn", "cuda"), "ratio_to_cuda"] == pytest.approx(1.0)


def test_invalid_failed_and_skipped_are_listed_and_never_averaged(
    everything: tuple[Path, pd.DataFrame],
) -> None:
    out, summary = everything
    rejected = pd.read_csv(out / "rejected.csv")
    assert list(rejected["line"]) == [4, 5]
    assert rejected["file"].str.endswith("problems.jsonl").all()
    assert "latency_us: 'max' is a required property" in rejected["error"].iloc[0]
    assert rejected["error"].iloc[1].startswith("not a JSON record")
    skipped = pd.read_csv(out / "skipped.csv")
    assert sorted(skipped["status"]) == ["failed", "failed", "skipped"]
    reasons = " | ".join(skipped["reason"])
    assert "result differs from the reference" in reasons
    assert "validated is false" in reasons
    assert "no CUDA GPU" in reasons
    # the bad records carry 777, 888 and 999 us: none may reach any statistic
    assert summary[["latency_us.avg", "latency_us.min", "latency_us.max"]].max().max() < 100
    assert summary.loc[NUMPY8, "repeats"] == 3
    assert not summary.index.str.contains("hbw_preferred").any()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["records"] == {"ok": 48, "failed": 2, "skipped": 1, "rejected": 2}


def test_outputs_complete_and_no_temporary_files(everything: tuple[Path, pd.DataFrame]) -> None:
    out, summary = everything
    assert {p.name for p in out.iterdir()} == OUTPUTS
    umask = os.umask(0o022)
    os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~umask}
    back = pd.read_parquet(out / "summary.parquet")
    assert len(back) == len(summary)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["run_ids"] == ["fixture-2026-11-29-r1", "fixture-2026-11-29-r2",
                               "fixture-2026-11-29-r3"]
    assert meta["hosts"] == ["node01"]
    assert meta["slurm_job_ids"] == ["1200", "1201", "1202", "1300", "1301"]
    assert meta["hbw_emulated"] is True


def test_a_failing_write_leaves_no_file(tmp_path: Path) -> None:
    loaded = load_records([FIXTURES / "collectives" / "rep1.jsonl"])
    summary = summarize(loaded)
    summary["run_ids"] = [{"not": "serializable"}, 1.5] + [None] * (len(summary) - 2)
    out = tmp_path / "out"
    with pytest.raises(Exception):  # noqa: B017 - pyarrow's own conversion error
        write_outputs(out, summary, loaded, {})
    assert not out.exists() or not list(out.iterdir())


def test_real_records_give_the_median_of_the_two_runs(tmp_path: Path) -> None:
    runs = sorted((FIXTURES / "real").glob("*.jsonl"))
    raw = [json.loads(line) for path in runs for line in path.read_text().splitlines()]
    result = aggregate(runs, tmp_path)
    summary = result.summary.set_index("point")
    assert len(summary) == len(raw) // 2
    assert (summary["repeats"] == 2).all()
    assert summary["emulated"].all()
    for op, buffer, size in [("allreduce", "hbw", 8), ("gather", "numpy", 65536)]:
        values = [r["latency_us"]["avg"] for r in raw
                  if (r["op"], r["buffer"], r["size_bytes"]) == (op, buffer, size)]
        key = f"collectives/{op}/{buffer}/float32/ranks=2/binding=none/size={size}"
        assert summary.loc[key, "latency_us.avg"] == pytest.approx(statistics.median(values))


def test_train_points_are_keyed_by_the_size_asked_for(tmp_path: Path) -> None:
    ok = json.loads((FIXTURES / "train" / "train.jsonl").read_text().splitlines()[0])
    ok.update(params_requested=125_000_000, params=124_439_808)
    skipped = {key: ok[key] for key in ok if key not in ("step_ms", "throughput")}
    skipped.update(status="skipped", reason="no CUDA GPU", params=125_000_000)
    (tmp_path / "r.jsonl").write_text(json.dumps(ok) + "\n" + json.dumps(skipped) + "\n")
    result = aggregate([tmp_path / "r.jsonl"], tmp_path / "out")
    point = result.summary["point"].iloc[0]
    assert "/params=125000000/" in point
    assert result.loaded.skipped[0]["point"] == point


def test_binding_label() -> None:
    assert binding_label({"name": "hbw", "numactl": ["--membind=1"]}) == "hbw"
    assert binding_label({"numactl": ["--cpunodebind=0", "--membind=1"], "cpus": [0]}) == (
        "--cpunodebind=0 --membind=1"
    )
    assert binding_label({"numactl": None, "cpus": [0, 1]}) == "none"


def test_cli_warns_on_stderr_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["aggregate", str(FIXTURES / "problems"), str(FIXTURES / "collectives"),
                 "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "2 invalid records left out" in err
    assert "problems.jsonl:4" in err
    assert "2 failed and 1 skipped" in err


@pytest.mark.parametrize(
    ("make_input", "message"),
    [
        (lambda tmp: tmp / "missing.jsonl", "missing.jsonl: no such file or folder"),
        (lambda tmp: tmp, "no records found"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture, make_input,
                               message: str) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    assert main(["aggregate", str(make_input(tmp_path)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hpcmem aggregate: error: RESULTS:")
    assert message in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
