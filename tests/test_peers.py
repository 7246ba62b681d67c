"""The peers (benchmarks/gpu/hf_offload.py's records) through aggregate, report and check,
and as Markdown.

Read from runs committed under benchmarks/results/ (H200): the figures each row shows are
recomputed here from the records themselves.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from hpcmem.cli import main
from hpcmem.peers.tables import Work, rows
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import benchmark_points

RESULTS = REPO / "benchmarks" / "results"
#: cuda, ZeRO-2 and ZeRO-3 with offload, FSDP2 offload and hpcmem, GPT-2-large and Llama
PEERS = RESULTS / "gpu-20261202-gpu-share" / "hf-peers.jsonl"
#: cuda and ZeRO-Offload timed over 8 steps, hpcmem twice over 10 (five more to plan)
UNEVEN = RESULTS / "gpu-20261203-fp32" / "hf-llama.jsonl"
#: cuda and hpcmem with the delayed update, 200 steps each
LONG = RESULTS / "gpu-20261202-delayed" / "hf-200.jsonl"
COLLECTIVES = Path(__file__).parent / "fixtures" / "records" / "collectives"
REFERENCES = REPO / "config" / "references.yaml"
GIB = 2**30


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step(records: list[dict], variant: str, model: str) -> float:
    return statistics.median(r["step_ms"]["median"] for r in records
                             if r["variant"] == variant and r["model"] == model
                             and r["status"] == "ok")


def _section(page: Path) -> str:
    text = page.read_text()
    section = text[text.index('id="peers"'):]
    return section[:section.index("</section>")]


def test_peer_records_aggregate_report_and_check_like_the_others(tmp_path: Path) -> None:
    summary, page, verdict = tmp_path / "summary", tmp_path / "report.html", tmp_path / "v.json"
    assert main(["aggregate", str(COLLECTIVES), str(PEERS), "--out", str(summary)]) == 0
    assert main(["check", str(summary), "--references", str(REFERENCES),
                 "--verdict-out", str(verdict)]) == 0
    assert main(["report", str(summary), "--verdict", str(verdict), "--out", str(page)]) == 0
    records = _records(PEERS)
    figures = {row["figure"]: row for row in json.loads(verdict.read_text())["figures"]}
    section = _section(page)
    assert 'alt="peers: step time against GPU memory held"' in section
    assert section.count("<table>") == 2  # GPT-2-large and Llama, 8 x 1024 tokens
    for model in ("gpt2-large", "llama-0.9b"):
        ours, zero = _step(records, "hpcmem", model), _step(records, "deepspeed", model)
        assert f"{ours:.1f}" in section and f"{ours / zero:.2f}x" in section
        (ratio,) = [row for key, row in figures.items()
                    if key.startswith(f"peers/{model}/") and "/hpcmem/" in key
                    and key.endswith("/vs_zero_offload")]
        assert ratio["value"] == pytest.approx(ours / zero)
        assert ratio["verdict"] == "PASS" and ratio["upper_bound"] == pytest.approx(0.65)
    judged = [key for key in figures if key.startswith("peers/")]
    assert sum(key.endswith("/step_ms.median") for key in judged) == len(records)
    for label in ("cuda, no limit", "DeepSpeed ZeRO-2 + offload_optimizer cpu",
                  "DeepSpeed ZeRO-3 + offload_param and offload_optimizer cpu",
                  "FSDP2 + CPUOffloadPolicy", "hpcmem, gpu_budget: per step: H2D"):
        assert label in section, label
    with (summary / "peers_step_time.csv").open() as table:
        assert len(list(csv.DictReader(table))) == len(records)


def test_a_ratio_beyond_its_reference_fails_the_check(tmp_path: Path) -> None:
    references = tmp_path / "references.yaml"
    references.write_text('references:\n  "*:*":\n'
                          '    "peers/*/hpcmem/*/vs_zero_offload": [0.2, null, 0.5, ratio]\n')
    aggregate([PEERS], tmp_path / "summary")
    verdict = tmp_path / "v.json"
    assert main(["check", str(tmp_path / "summary"), "--references", str(references),
                 "--verdict-out", str(verdict)]) == 1
    failed = [row["figure"] for row in json.loads(verdict.read_text())["figures"]
              if row["verdict"] == "FAIL"]
    assert len(failed) == 2 and all(key.endswith("/vs_zero_offload") for key in failed)


def test_a_report_without_peers_has_no_peers_section(tmp_path: Path) -> None:
    aggregate([COLLECTIVES], tmp_path / "summary")
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "summary"), "--out", str(page)]) == 0
    assert 'id="peers"' not in page.read_text() and 'id="train"' in page.read_text()


def test_report_has_no_offload_option(tmp_path: Path) -> None:
    aggregate([COLLECTIVES], tmp_path / "summary")
    with pytest.raises(SystemExit) as stopped:
        main(["report", str(tmp_path / "summary"), "--offload", str(PEERS),
              "--out", str(tmp_path / "report.html")])
    assert stopped.value.code == 2


def test_repeats_timed_over_other_step_counts_are_one_point(tmp_path: Path) -> None:
    records = _records(UNEVEN)
    assert {r["steps"] for r in records} == {8, 10}
    (work,) = tables = rows(benchmark_points(aggregate([UNEVEN], tmp_path).summary, "peers"))
    assert work == Work("llama-0.9b", "bf16", 8, 1024, 1)
    by_variant = {row.variant: row for row in tables[work]}
    assert list(by_variant) == ["cuda", "deepspeed", "hpcmem"]
    ours = by_variant["hpcmem"]
    # two runs whose budgets, taken from ZeRO-Offload's peak, differ by bytes: one point
    assert sorted(ours.each_ms) == sorted(r["step_ms"]["median"] for r in records
                                          if r["variant"] == "hpcmem")
    assert ours.step_ms == pytest.approx(_step(records, "hpcmem", "llama-0.9b"))
    assert ours.vs_zero == pytest.approx(ours.step_ms / by_variant["deepspeed"].step_ms)
    assert ours.vs_cuda == pytest.approx(ours.step_ms / by_variant["cuda"].step_ms)
    assert ours.tokens_per_s == pytest.approx(8 * 1024 / ours.step_ms * 1e3)
    assert ours.budget / GIB == pytest.approx(8.66, abs=0.005)
    assert ours.gpu_bytes == pytest.approx(statistics.median(
        r["held_peak_bytes"] for r in records if r["variant"] == "hpcmem"))
    # its losses ran 10 steps, cuda's 8: not compared
    assert ours.loss_vs_cuda is None and by_variant["deepspeed"].loss_vs_cuda is not None


def test_the_last_loss_is_compared_with_cudas_after_as_many_steps(tmp_path: Path) -> None:
    records = _records(LONG)
    ours, cuda = (next(r["losses"] for r in records if r["variant"] == variant)
                  for variant in ("hpcmem", "cuda"))
    assert len(ours) == len(cuda) == 200
    (table,) = rows(benchmark_points(aggregate([LONG], tmp_path).summary, "peers")).values()
    by_variant = {row.variant: row for row in table}
    assert by_variant["hpcmem"].loss_vs_cuda == pytest.approx(abs(ours[-1] - cuda[-1]) / cuda[-1])
    assert by_variant["hpcmem"].loss_steps == 200 and by_variant["cuda"].loss_vs_cuda == 0


def test_hf_table_prints_one_table_per_work() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(UNEVEN)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "## llama-0.9b, bf16, 8 x 1024 tokens per step"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and "**" in line] == [
        "| cuda, no limit", "| DeepSpeed ZeRO-2 + offload_optimizer cpu", "| hpcmem, gpu_budget"]
    assert lines[-1].startswith("hpcmem, gpu_budget at 8.66 GiB, per step: H2D")


def test_hf_table_refuses_a_bad_line_naming_it(tmp_path: Path) -> None:
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + json.dumps({**OK, "batch": 0}) + "\n")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(records)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"{records}:2: batch=0: a whole number, at least 1, is accepted\n")


OK = {"variant": "cuda", "model": "m", "batch": 8, "seq_len": 1024, "status": "ok",
      "date": "2026-12-02T01:19:42Z", "step_ms": {"median": 10.0}}


@pytest.mark.parametrize(("line", "says"), [
    ("[1, 2]", "<record>: [1, 2] is not of type 'object'"),
    ("{not json", "not a JSON record (Expecting property name enclosed in double quotes; "
                  "column 2)"),
    (json.dumps({**OK, "variant": "zero"}),
     "variant='zero': one of cuda, deepspeed, deepspeed3, zenflow, fsdp2, torchao, "
     "megatrain, hpcmem is accepted"),
    (json.dumps({**OK, "batch": 0}), "batch=0: a whole number, at least 1, is accepted"),
    (json.dumps({**OK, "seq_len": "1024"}), "seq_len='1024': a whole number"),
    (json.dumps({**OK, "step_ms": {"median": 0}}), "step_ms={'median': 0}: an ok record's "
                                                   "step_ms with a median above 0 ms"),
    (json.dumps({key: v for key, v in OK.items() if key != "model"}), "model=None"),
    (json.dumps({**OK, "peak_reserved_bytes": "8 GiB"}),
     "peak_reserved_bytes='8 GiB': a number of bytes, or null, is accepted"),
    (json.dumps({**OK, "gpu_budget": -1}), "gpu_budget=-1: a number of bytes"),
    (json.dumps({**OK, "losses": [1.0, "nan"]}),
     "losses=[1.0, 'nan']: a list of numbers, or null, is accepted"),
    (json.dumps({**OK, "variant": "hpcmem"}),
     "memory=None: an object of memory statistics, in an ok hpcmem record, is accepted"),
    (json.dumps({**OK, "status": "oom"}), "status='oom': one of ok, failed, skipped"),
    (json.dumps({**OK, "date": None}), "date=None: the run's UTC time (ISO 8601) is accepted"),
    (json.dumps({**OK, "dtype": ["bf16"]}), "dtype=['bf16']: a dtype's name is accepted"),
    (json.dumps({**OK, "checkpointing": "yes"}), "checkpointing='yes': true, false or null"),
    (json.dumps({**OK, "offload": [1]}), "offload=[1]: hpcmem's Offload settings"),
    (json.dumps({**OK, "offload": {"gpu_share": 2}}),
     "offload.gpu_share=2: a share from 0 to 1, or null, is accepted"),
    (json.dumps({**OK, "offload": {"threads": 0}}),
     "offload.threads=0: a whole number of threads, at least 1, or null, is accepted"),
])
def test_a_bad_record_is_left_out_naming_its_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, says: str) -> None:
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + line + "\n")
    summary = tmp_path / "summary"
    assert main(["aggregate", str(records), "--out", str(summary)]) == 0
    assert f"{records}:2: {says}" in capsys.readouterr().err
    with (summary / "rejected.csv").open() as table:
        (rejected,) = csv.DictReader(table)
    assert (rejected["file"], rejected["line"]) == (str(records), "2")
    assert rejected["error"].startswith(says), rejected["error"]
    assert main(["check", str(summary), "--references", str(REFERENCES)]) == 1
    assert f"invalid record: {says}" in capsys.readouterr().out


def test_a_record_missing_its_accounting_still_draws(tmp_path: Path) -> None:
    ours = {**OK, "variant": "hpcmem", "gpu_budget": 8 * GIB, "memory": {"offload": None},
            "date": "2026-12-02T01:21:32Z"}
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + json.dumps(ours) + "\n")
    aggregate([records], tmp_path / "summary")
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "summary"), "--out", str(page)]) == 0
    assert "hpcmem, gpu_budget: per step: H2D — GB (— ms busy)" in _section(page)


def test_a_failed_run_is_a_failed_point(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    failed = {**OK, "variant": "deepspeed", "status": "failed",
              "reason": "OutOfMemoryError: CUDA out of memory"}
    records = tmp_path / "hf.jsonl"
    records.write_text(json.dumps(OK) + "\n" + json.dumps(failed) + "\n")
    summary, page = tmp_path / "summary", tmp_path / "report.html"
    aggregate([records], summary)
    with (summary / "skipped.csv").open() as table:
        (skipped,) = csv.DictReader(table)
    assert (skipped["benchmark"], skipped["status"], skipped["reason"]) == (
        "peers", "failed", failed["reason"])
    assert main(["check", str(summary), "--references", str(REFERENCES)]) == 1
    assert f"point failed: {failed['reason']}" in capsys.readouterr().out
    assert main(["report", str(summary), "--out", str(page)]) == 0
    assert "1 peers point failed or skipped" in _section(page)
