"""The training report's scaling with GPUs: throughput and efficiency against world size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import Summary, benchmark_points, read_summary
from hpcmem.train import scaling

FIXTURE = Path(__file__).parent / "fixtures" / "records" / "train" / "train.jsonl"
#: the fixture's first record: transformer, batch 8 (global), seq 2048, policy cuda
TOKENS = 8 * 2048
SERIES = "transformer/params=350000000/batch=8/seq=2048/bf16/budget=none/policy=cuda"


def _record(world_size: int, step_ms: float | None, policy: str = "cuda") -> dict:
    """The fixture's first record run on ``world_size`` GPUs at ``step_ms`` (None: failed)."""
    record = json.loads(FIXTURE.read_text().splitlines()[0])
    record.update(world_size=world_size, policy={"name": policy, "types": {}},
                  timestamp=f"2026-11-29T04:0{world_size}:00+00:00")
    if step_ms is None:
        for metric in ("step_ms", "first_step_ms", "throughput", "oversubscription"):
            record.pop(metric)
        return {**record, "status": "failed", "reason": "CUDA out of memory on rank 3"}
    return {**record, "step_ms": {"median": step_ms, "p10": step_ms, "p90": step_ms},
            "throughput": TOKENS * 1000 / step_ms}  # as a run records it at that median


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    """cuda on 1, 2 and 4 GPUs (100, 64, 40 ms), failed on 8; um on 1 GPU only."""
    base = tmp_path_factory.mktemp("scaling")
    records = [_record(1, 100.0), _record(2, 64.0), _record(4, 40.0), _record(8, None),
               _record(1, 120.0, "um")]
    (base / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    aggregate([base / "train.jsonl"], base / "summary")
    return read_summary(base / "summary")


def _train(summary: Summary) -> tuple:
    return (benchmark_points(summary.points, "train"),
            benchmark_points(summary.skipped, "train"))


def test_throughput_and_efficiency_of_a_series_run_on_one_two_and_four_gpus(summary):
    table = scaling.scaling_table(*_train(summary))
    assert list(table["series"]) == [SERIES] * 4  # um ran on one GPU only: not a series
    assert list(table["gpus"]) == [1, 2, 4, 8]
    assert list(table["status"]) == ["ok", "ok", "ok", "failed"]
    one, two, four = TOKENS * 1000 / 100, TOKENS * 1000 / 64, TOKENS * 1000 / 40
    assert (one, two, four) == (163840, 256000, 409600)
    assert list(table["throughput"][:3]) == [one, two, four]
    assert list(table["efficiency"][:3]) == [1.0, two / (2 * one), four / (4 * one)]
    assert list(table["efficiency"][:3]) == [1.0, 0.78125, 0.625]
    assert math.isnan(table["throughput"][3]) and math.isnan(table["efficiency"][3])
    assert set(table["baseline_gpus"]) == {1}
    assert table["reason"][3] == "CUDA out of memory on rank 3"


def test_the_report_draws_the_figure_and_lists_the_failed_point(summary, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(summary.folder), "--out", str(page)]) == 0
    text = page.read_text()
    assert text.count("<h3>Scaling with GPUs</h3>") == 1
    assert text.count('alt="training throughput and scaling efficiency against the number '
                      'of GPUs"') == 1
    scaled = text[text.index("<h3>Scaling with GPUs</h3>"):]
    scaled = scaled[:scaled.index("</table>")]
    for cell in ("163,840 tokens/s", "256,000 tokens/s", "409,600 tokens/s",
                 "100.0%", "78.1%", "62.5%", "<td>failed</td>", "CUDA out of memory on rank 3"):
        assert cell in scaled, cell
    assert scaled.count("<tr>") == 1 + 4  # the header, 1, 2, 4 and the failed 8
    assert "policy=um" not in scaled


def test_no_series_with_two_gpu_counts_draws_nothing(summary):
    points, left_out = _train(summary)
    one_each = points[points["world_size"] == 1]
    assert scaling.scaling_table(one_each, left_out.iloc[0:0]).empty
    assert scaling.section(one_each, left_out.iloc[0:0]) == ""
    # a point that failed on a second GPU count still makes a series: its failure is listed
    failed = scaling.scaling_table(one_each, left_out)
    assert list(failed["gpus"]) == [1, 8] and list(failed["status"]) == ["ok", "failed"]
