"""The offload anchors' records (benchmarks/gpu/hf_offload.py) in the report and in Markdown.

Read from runs committed under benchmarks/results/ (H200): the figures each row shows are
recomputed here from the records themselves.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate
from hpcmem.train.offload_anchors import Work, read_records, rows

RESULTS = REPO / "benchmarks" / "results"
#: cuda, ZeRO-2 and ZeRO-3 with offload, FSDP2 offload and hpcmem, GPT-2-large and Llama
ANCHORS = RESULTS / "gpu-20261202-gpu-share" / "hf-anchors.jsonl"
#: cuda and ZeRO-Offload timed over 8 steps, hpcmem over 10 (five more to plan)
UNEVEN = RESULTS / "gpu-20261203-fp32" / "hf-llama.jsonl"
SUMMARY_RECORDS = Path(__file__).parent / "fixtures" / "records" / "collectives"
GIB = 2**30


def _step(records: list[dict], variant: str, model: str) -> float:
    return statistics.median(r["step_ms"]["median"] for r in records
                             if r["variant"] == variant and r["model"] == model
                             and r["status"] == "ok")


def test_the_report_draws_every_tool_beside_the_budgets(tmp_path: Path) -> None:
    aggregate([SUMMARY_RECORDS], tmp_path / "summary")
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "summary"), "--offload", str(ANCHORS),
                 "--out", str(page)]) == 0
    text = page.read_text()
    section = text[text.index('id="offload"'):]
    section = section[:section.index("</section>")]
    assert 'alt="offload anchors: step time against GPU memory held"' in section
    assert section.count("<table>") == 2  # GPT-2-large and Llama, 8 x 1024 tokens
    records = [json.loads(line) for line in ANCHORS.read_text().splitlines()]
    for model in ("gpt2-large", "llama-0.9b"):
        ours, zero = _step(records, "hpcmem", model), _step(records, "deepspeed", model)
        assert f"{ours:.1f}" in section and f"{ours / zero:.2f}x" in section
    for label in ("cuda, no limit", "DeepSpeed ZeRO-2 + offload_optimizer cpu",
                  "DeepSpeed ZeRO-3 + offload_param and offload_optimizer cpu",
                  "FSDP2 + CPUOffloadPolicy", "hpcmem, gpu_budget: per step: strategy"):
        assert label in section, label


def test_runs_timed_over_other_step_counts_share_their_works_table() -> None:
    records = read_records(UNEVEN)
    assert {r["steps"] for r in records} == {8, 10}
    (work,) = tables = rows(records)
    assert work == Work("llama-0.9b", "bf16", 8, 1024, 1)
    by_key = {row.key.split("@")[0]: row for row in tables[work]}
    assert list(by_key) == ["cuda", "deepspeed", "hpcmem"]
    ours = by_key["hpcmem"]
    assert ours.step_ms == pytest.approx(_step(records, "hpcmem", "llama-0.9b"))
    assert ours.vs_zero == pytest.approx(ours.step_ms / by_key["deepspeed"].step_ms)
    assert ours.vs_cuda == pytest.approx(ours.step_ms / by_key["cuda"].step_ms)
    assert ours.tokens_per_s == pytest.approx(8 * 1024 / ours.step_ms * 1e3)
    assert ours.budget / GIB == pytest.approx(8.66, abs=0.005)
    # the losses of the 8 steps both ran: the same seed and batches
    cuda_losses = next(r["losses"] for r in records if r["variant"] == "cuda")
    gaps = [max(abs(a - b) / b for a, b in zip(r["losses"][:8], cuda_losses, strict=True))
            for r in records if r["variant"] == "hpcmem"]
    assert ours.loss_steps == 8 and ours.loss_gap == pytest.approx(statistics.median(gaps))
    assert ours.gpu_bytes == pytest.approx(statistics.median(
        r["held_peak_bytes"] for r in records if r["variant"] == "hpcmem"))


def test_hf_table_prints_one_table_per_work() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(UNEVEN)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "## llama-0.9b, bf16, 8 x 1024 tokens per step"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and "**" in line] == [
        "| cuda, no limit", "| DeepSpeed ZeRO-2 + offload_optimizer cpu", "| hpcmem, gpu_budget"]
    assert lines[-1].startswith("hpcmem, gpu_budget at 8.66 GiB, per step: strategy")


OK = {"variant": "cuda", "model": "m", "batch": 8, "seq_len": 1024, "status": "ok",
      "step_ms": {"median": 10.0}}


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", ":2: not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("[1, 2]", ":2: list where a record (a JSON object) of benchmarks/gpu/hf_offload.py is "
               "accepted"),
    (json.dumps({**OK, "variant": "zero"}), ":2: variant='zero': one of cuda, deepspeed, "
                                            "deepspeed3, fsdp2, hpcmem is accepted"),
    (json.dumps({**OK, "batch": 0}), ":2: batch=0: a whole number, at least 1, is accepted"),
    (json.dumps({**OK, "seq_len": "1024"}), ":2: seq_len='1024': a whole number"),
    (json.dumps({**OK, "step_ms": {"median": 0}}), ":2: step_ms={'median': 0}: an ok record's "
                                                   "step_ms is accepted with a median above 0"),
    (json.dumps({key: v for key, v in OK.items() if key != "model"}), ":2: model=None"),
    (json.dumps({**OK, "peak_reserved_bytes": "8 GiB"}),
     ":2: peak_reserved_bytes='8 GiB': a number of bytes, or null, is accepted"),
    (json.dumps({**OK, "gpu_budget": -1}), ":2: gpu_budget=-1: a number of bytes"),
    (json.dumps({**OK, "losses": [1.0, "nan"]}),
     ":2: losses=[1.0, 'nan']: a list of numbers, or null, is accepted"),
    (json.dumps({**OK, "variant": "hpcmem"}),
     ":2: memory=None: an ok hpcmem record's memory statistics (an object) are accepted"),
    (json.dumps({**OK, "status": None}), ":2: status=None: ok, or a failure's word"),
    (json.dumps({**OK, "dtype": ["bf16"]}), ":2: dtype=['bf16']: a dtype's name is accepted"),
    (json.dumps({**OK, "offload": [1]}), ":2: offload=[1]: hpcmem's Offload settings"),
    (json.dumps({**OK, "offload": {"gpu_share": 2}}),
     ":2: offload.gpu_share=2: a share from 0 to 1, or null, is accepted"),
    (json.dumps({**OK, "offload": {"threads": 0}}),
     ":2: offload.threads=0: a whole number of threads, at least 1, or null, is accepted"),
])
def test_a_bad_record_is_one_line_naming_its_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, says: str) -> None:
    aggregate([SUMMARY_RECORDS], tmp_path / "summary")
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + line + "\n")
    page = tmp_path / "report.html"
    page.write_text("the last report")
    assert main(["report", str(tmp_path / "summary"), "--offload", str(records),
                 "--out", str(page)]) == 2
    (message,) = capsys.readouterr().err.strip().splitlines()
    assert message.startswith(f"hpcmem report: error: --offload: {records}{says}"), message
    assert page.read_text() == "the last report"


def test_a_record_missing_its_accounting_still_draws(tmp_path: Path) -> None:
    ours = {**OK, "variant": "hpcmem", "gpu_budget": 8 * GIB, "memory": {"offload": None}}
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + json.dumps(ours) + "\n")
    aggregate([SUMMARY_RECORDS], tmp_path / "summary")
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "summary"), "--offload", str(records),
                 "--out", str(page)]) == 0
    assert ("hpcmem, gpu_budget: per step: strategy —, H2D 0.00 GB (— ms busy)"
            in page.read_text())


def test_a_file_without_records_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "hf.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        read_records(empty)
