"""The report's budget curve, drawn from the H200 run committed under benchmarks/results."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pandas")

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import read_summary
from hpcmem.train.budget_curve import MEMORY, budget_points

RUN = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu-20261130-um-stream-f"


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("curve") / "summary"
    aggregate([RUN / "train.jsonl"], out)
    return out


def test_every_budgeted_model_has_its_curve_and_the_variants_it_is_compared_with(summary):
    table = budget_points(read_summary(summary).points)
    for params, group in table.groupby("params"):
        budgeted = group[group["gpu_budget"].notna()]
        assert len(budgeted) >= 4, params  # 100, 50, 25 and 10% of the footprint at least
        assert (budgeted[MEMORY] <= budgeted["gpu_budget"] * 1.05).all()
        assert {"cuda", "fsdp2_cpu_offload", "fsdp2_cpu_offload_activations"} <= set(
            group.loc[group["gpu_budget"].isna(), "policy"])
    assert table["params"].nunique() == 2  # the 0.35B and the 1.3B transformers


def test_the_report_draws_the_budget_curve(summary, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(summary), "--out", str(page)]) == 0
    text = page.read_text()
    assert 'alt="budget curve: step time against GPU memory held"' in text
    assert "GPU memory each variant held" in text


def test_a_summary_without_budgets_has_no_curve(summary):
    points = read_summary(summary).points
    assert budget_points(points[points["gpu_budget"].isna()]).empty
