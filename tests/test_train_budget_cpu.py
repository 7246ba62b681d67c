"""Real host-optimizer runs on the CPU (the CPU transport): where a budgeted step's time goes,
aggregated and drawn, and micro-batches accumulated into one optimizer step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pandas")

from cpu_memory import CpuMemory  # noqa: E402

from hpcmem.cli import main  # noqa: E402
from hpcmem.node import applied  # noqa: E402
from hpcmem.results.aggregate import aggregate  # noqa: E402
from hpcmem.results.summary import read_summary  # noqa: E402
from hpcmem.train.benchmark import shape_for_params, train_point  # noqa: E402
from hpcmem.train.data import synthetic_data  # noqa: E402
from hpcmem.train.point import make_point  # noqa: E402
from hpcmem.train.spec import TRAIN  # noqa: E402
from hpcmem.train.time_bars import PARTS, time_parts  # noqa: E402

BUDGETS = ("512M", "1G")
H200_RUN = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu-20261130-um-stream-f"


def _record(budget: str, accumulate: int = 1, steps: int = 3,
            delayed_update: bool = False, state_dtype: str = "float32") -> dict:
    point = make_point(params="3M", batch=2, seq_len=64, vocab=512, gpu_budget=budget,
                       steps=steps, warmup=1, device="cpu", dtype="fp32",
                       accumulate=accumulate, delayed_update=delayed_update,
                       state_dtype=state_dtype)
    data = synthetic_data(point.model, batch=point.batch, seq_len=point.seq_len,
                          vocab=point.vocab, image_size=0, classes=10, seed=point.seed)
    return train_point(point, shape_for_params(point), data, CpuMemory(point.gpu_budget),
                       device=torch.device("cpu"), binding=applied.current(),
                       offload="host_optimizer")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    folder = tmp_path_factory.mktemp("time-bars")
    records = [_record(budget) for budget in BUDGETS]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    aggregate([folder / "train.jsonl"], folder / "summary")
    return records, folder / "summary"


def test_each_budget_s_bars_are_what_its_record_measured(runs):
    records, summary = runs
    table = time_parts(read_summary(summary).points)
    assert len(table) == len(BUDGETS)
    for record in records:
        assert record["status"] == "ok" and record["offload_strategy"] == "host_optimizer"
        (row,) = table[table["gpu_budget"] == record["gpu_budget"]].to_dict("records")
        for column, _label in PARTS:
            expected = record["step_ms"]["median"] if column == "step_ms.median" else record[column]
            assert row[column] == pytest.approx(expected), column
        # the floor: fp32 weights in and their gradients out once, at the measured rates
        rates, weights = record["pcie_bandwidth"], record["params"] * 4
        assert record["pcie_floor_ms"] == pytest.approx(
            max(weights / rates["h2d"], weights / rates["d2h"]) * 1e3)
        assert record["step_bound_ms"] >= max(record["compute_ms"], record["cpu_optimizer_ms"])
        assert 0 < record["backward_ms"] < record["compute_ms"]


def test_the_report_draws_them_in_the_training_section(runs, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(runs[1]), "--out", str(page)]) == 0
    text = page.read_text()
    assert 'alt="where a budgeted step&#x27;s time goes"' in text
    # no budget curve: on the CPU nothing was held on a GPU, so nothing to put on its axis
    assert 'alt="budget curve' not in text


def test_runs_that_did_not_account_for_their_steps_have_no_bars(tmp_path):
    aggregate([H200_RUN / "train.jsonl"], tmp_path / "summary")  # the streaming strategy's
    assert time_parts(read_summary(tmp_path / "summary").points).empty


def test_micro_batches_accumulate_into_one_optimizer_step():
    record = _record("1G", accumulate=3)
    assert record["status"] == "ok" and record["accumulate"] == 3
    offload = record["memory"]["offload"]
    # the ledger counts optimizer steps: one per timed step, not one per micro-batch
    assert offload["micro_batches"] == 3 and offload["steps"] == 3
    tokens = record["batch"] * record["seq_len"] * 3
    assert record["throughput"] == pytest.approx(tokens / (record["step_ms"]["median"] / 1e3))
    assert "/batch=2/accum=3/" in TRAIN.point_key(record)
    # the loss of a step is the mean of its micro-batches': near ln(vocab) at the start
    assert abs(record["losses"]["first"][0] - math.log(512)) < 0.5


def _apart(tmp_path: Path, plain: dict, variant: dict, part: str):
    """The time bars' table of ``plain`` and ``variant``, whose key is ``plain``'s with
    ``part`` before its policy."""
    keys = [TRAIN.point_key(r) for r in (plain, variant)]
    assert part not in keys[0] and keys[1] == keys[0].replace("/policy=", f"{part}/policy=")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (plain, variant)))
    aggregate([tmp_path / "train.jsonl"], tmp_path / "summary")
    return time_parts(read_summary(tmp_path / "summary").points)


def test_the_delayed_update_is_a_point_of_its_own(tmp_path):
    # 7 steps: the update is delayed from the steady phase (step 5) on
    plain, delayed = (_record("1G", steps=6, delayed_update=flag) for flag in (False, True))
    assert delayed["status"] == "ok" and delayed["delayed_update"] is True
    assert delayed["memory"]["offload"]["delayed_update"] is True
    assert plain["memory"]["offload"]["delayed_update"] is False
    # the same steps up to the plan; then the next forward runs on weights one update behind
    assert delayed["losses"]["first"] == plain["losses"]["first"]
    assert delayed["losses"]["last"][-2:] != plain["losses"]["last"][-2:]
    table = _apart(tmp_path, plain, delayed, "/delayed=True")
    assert list(table["delayed_update"]) == [False, True]


def test_bf16_moments_are_a_point_of_their_own(tmp_path):
    plain, narrow = (_record("1G", steps=4, state_dtype=dtype) for dtype in ("float32",
                                                                              "bfloat16"))
    assert narrow["status"] == "ok" and narrow["state_dtype"] == "bfloat16"
    assert narrow["memory"]["offload"]["state_dtype"] == "bfloat16"
    assert plain["memory"]["offload"]["state_dtype"] == "float32"
    # the first update comes from unrounded moments: the first two losses are the same;
    # then the rounded moments move the weights a little differently
    ours, theirs = narrow["losses"]["first"], plain["losses"]["first"]
    assert ours[:2] == theirs[:2]
    for mine, reference in zip(ours[2:], theirs[2:], strict=True):
        assert mine != reference and abs(mine - reference) <= 1e-2 * abs(reference)
    table = _apart(tmp_path, plain, narrow, "/state=bfloat16")
    assert sorted(table["state_dtype"]) == ["bfloat16", "float32"]  # two rows, not one
    assert list(table["delayed_update"]) == [False, False]
