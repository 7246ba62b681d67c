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
from hpcmem.draw.plots import new_figure
from hpcmem.peers.floor import bars, draw
from hpcmem.peers.tables import Work, rows
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import benchmark_points, read_summary

RESULTS = REPO / "benchmarks" / "results"
#: cuda, ZeRO-2 and ZeRO-3 with offload, FSDP2 offload and hpcmem, GPT-2-large and Llama
PEERS = RESULTS / "gpu-20261202-gpu-share" / "hf-peers.jsonl"
#: cuda and ZeRO-Offload timed over 8 steps, hpcmem twice over 10 (five more to plan)
UNEVEN = RESULTS / "gpu-20261203-fp32" / "hf-llama.jsonl"
#: cuda and hpcmem with the delayed update, 200 steps each
LONG = RESULTS / "gpu-20261202-delayed" / "hf-200.jsonl"
#: cuda, ZeRO-Offload, ZenFlow (a slow step every 4th), torchao and hpcmem, with mean steps
ZENFLOW = RESULTS / "gpu-20261206-peers" / "hf.jsonl"
COLLECTIVES = Path(__file__).parent / "fixtures" / "records" / "collectives"
REFERENCES = REPO / "config" / "references.yaml"
GIB = 2**30


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step(records: list[dict], variant: str, model: str, basis: str = "median") -> float:
    return statistics.median(r["step_ms"][basis] for r in records
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
    # GPT-2-large and Llama, 8 x 1024 tokens, and the smallest budget's
    assert section.count("<table>") == 3
    for model in ("gpt2-large", "llama-0.9b"):
        ours, zero = _step(records, "hpcmem", model), _step(records, "deepspeed", model)
        assert f"{ours:.1f}" in section and f"{ours / zero:.2f}x" in section
        (ratio,) = [row for key, row in figures.items()
                    if key.startswith(f"peers/{model}/") and "/hpcmem/" in key
                    and key.endswith("/vs_zero_offload")]
        assert ratio["value"] == pytest.approx(ours / zero)
        assert ratio["verdict"] == "PASS" and ratio["upper_bound"] == pytest.approx(0.65)
        # no record has a mean step: the median is compared, and ZeRO-2 was the fastest peer
        (best,) = [row for key, row in figures.items()
                   if key.startswith(f"peers/{model}/") and key.endswith("/vs_best_peer")]
        assert best["value"] == pytest.approx(ours / zero) and best["verdict"] == "PASS"
    assert section.count("Step: each run&#x27;s median step (these records time no mean)") == 2
    assert "the fastest peer tool: DeepSpeed ZeRO-2 + offload_optimizer cpu" in section
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


def test_hf_table_lists_a_point_that_did_not_train(tmp_path: Path) -> None:
    records = tmp_path / "hf.jsonl"
    failed = {**OK, "variant": "torchao", "batch": 32, "status": "failed", "step_ms": None,
              "reason": "OutOfMemoryError: CUDA out of memory. | Tried\nsecond line"}
    records.write_text(json.dumps(OK) + "\n" + json.dumps(failed) + "\n")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(records)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    tables, left_out = done.stdout.split("## Not trained")
    assert tables.startswith("## m, bf16, 8 x 1024 tokens per step")
    (row,) = [line for line in left_out.splitlines() if "torchao" in line]
    assert "batch=32" in row and "| failed | OutOfMemoryError: CUDA out of memory. / Tried |" in row
    blank = {**failed, "variant": "fsdp2", "reason": "  "}  # nothing trained: the list alone
    records.write_text(json.dumps(failed) + "\n" + json.dumps(blank) + "\n")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(records)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("## Not trained"), done.stderr
    assert any("fsdp2" in line and line.endswith("| failed |  |")
               for line in done.stdout.splitlines())


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
    (json.dumps({**OK, "world_size": 0}), "world_size=0: a whole number, at least 1, is accepted"),
    (json.dumps({**OK, "ranks": [1]}),
     "ranks=[1]: a list of each rank's figures (objects), or null, is accepted"),
    (json.dumps({**OK, "seq_len": "1024"}), "seq_len='1024': a whole number"),
    (json.dumps({**OK, "step_ms": {"median": 0}}), "step_ms={'median': 0}: an ok record's "
                                                   "step_ms with a median above 0 ms"),
    (json.dumps({**OK, "step_ms": {"median": 10.0, "mean": 0}}),
     "step_ms.mean=0: a mean step above 0 ms, or none, is accepted"),
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


def test_a_periodic_slow_step_ranks_by_the_mean(tmp_path: Path) -> None:
    # ZenFlow's every 4th step also runs the CPU optimizer: by the median it would be the
    # fastest peer, by the mean (total time over the timed steps) torchao is
    records = _records(ZENFLOW)
    assert all("mean" in r["step_ms"] for r in records)
    zenflow, torchao = ({basis: _step(records, variant, "llama-0.9b", basis)
                         for basis in ("median", "mean")} for variant in ("zenflow", "torchao"))
    assert zenflow["median"] < torchao["median"] and zenflow["mean"] > torchao["mean"]
    summary, page, verdict = tmp_path / "summary", tmp_path / "report.html", tmp_path / "v.json"
    assert main(["aggregate", str(ZENFLOW), "--out", str(summary)]) == 0
    assert main(["check", str(summary), "--references", str(REFERENCES),
                 "--verdict-out", str(verdict)]) == 0
    assert main(["report", str(summary), "--verdict", str(verdict), "--out", str(page)]) == 0
    (table,) = rows(benchmark_points(aggregate([ZENFLOW], tmp_path / "again").summary,
                                     "peers")).values()
    fastest = "torchao CPUOffloadOptimizer"
    for row in table:
        assert row.basis == "mean" and row.fastest_peer == fastest
        if row.variant != "hpcmem":  # hpcmem's two points are below
            assert row.step_ms == pytest.approx(_step(records, row.variant, "llama-0.9b", "mean"))
        assert row.vs_best == pytest.approx(row.step_ms / torchao["mean"])
        assert row.tokens_per_s == pytest.approx(8 * 1024 / row.step_ms * 1e3)
    ours = [row for row in table if row.variant == "hpcmem"]
    assert sorted(row.step_ms for row in ours) == sorted(
        r["step_ms"]["mean"] for r in records if r["variant"] == "hpcmem")
    figures = {row["figure"]: row for row in json.loads(verdict.read_text())["figures"]}
    best = [row for key, row in figures.items() if key.endswith("/vs_best_peer")]
    assert sorted(row["value"] for row in best) == pytest.approx(
        sorted(row.step_ms / torchao["mean"] for row in ours))
    assert all(row["verdict"] == "PASS" and row["upper_bound"] == 1 for row in best)
    assert sum(key.endswith("/step_ms.mean") for key in figures) == len(
        {row.key for row in table})
    section = _section(page)
    assert f"the fastest peer tool: {fastest} ({torchao['mean']:.1f} ms)" in section
    assert "each run&#x27;s mean step (total time over its timed steps)" in section
    with (summary / "peers_step_time.csv").open() as csv_table:
        written = list(csv.DictReader(csv_table))
    assert {line["step_basis"] for line in written} == {"mean"}
    assert {line["fastest_peer"] for line in written} == {
        row.key for row in table if row.variant == "torchao"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "hf_table.py"),
                           str(ZENFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| step ms, mean (repeats) |" in done.stdout and "| vs fastest peer |" in done.stdout
    assert f"the fastest peer tool: {fastest} ({torchao['mean']:.1f} ms)." in done.stdout


def _run(variant: str, steps: list[float], **fields: object) -> dict:
    """A record of ``variant`` whose timed steps took ``steps`` ms."""
    record = {**OK, "variant": variant, "checkpointing": variant != "hpcmem",
              "step_ms": {"median": statistics.median(steps), "mean": statistics.fmean(steps),
                          "min": min(steps), "max": max(steps)}, **fields}
    if variant == "hpcmem":
        record.update(gpu_budget=8 * GIB, memory={"offload": None})
    return record


def test_losing_to_a_peer_fails_the_check(tmp_path: Path) -> None:
    # hpcmem beats ZenFlow's median step but not its mean, nor torchao's: it lost
    records = tmp_path / "hf.jsonl"
    runs = [_run("cuda", [50.0] * 4), _run("deepspeed", [400.0] * 4),
            _run("zenflow", [90.0, 90.0, 90.0, 330.0]), _run("torchao", [118.0, 120.0] * 2),
            _run("hpcmem", [130.0] * 4)]
    records.write_text("".join(json.dumps(run) + "\n" for run in runs))
    summary, verdict = tmp_path / "summary", tmp_path / "v.json"
    assert main(["aggregate", str(records), "--out", str(summary)]) == 0
    assert main(["check", str(summary), "--references", str(REFERENCES),
                 "--verdict-out", str(verdict)]) == 1
    failed = [row for row in json.loads(verdict.read_text())["figures"]
              if row["verdict"] == "FAIL"]
    (lost,) = failed
    assert "/hpcmem/" in lost["figure"] and lost["figure"].endswith("/vs_best_peer")
    assert lost["value"] == pytest.approx(130 / 119) and lost["upper_bound"] == 1
    (table,) = rows(benchmark_points(aggregate([records], tmp_path / "again").summary,
                                     "peers")).values()
    assert {row.fastest_peer for row in table} == {"torchao CPUOffloadOptimizer"}
    by_variant = {row.variant: row for row in table}
    assert by_variant["zenflow"].step_ms == 150 and by_variant["zenflow"].vs_best == pytest.approx(
        150 / 119)
    assert by_variant["hpcmem"].vs_zero == pytest.approx(130 / 400)  # ZeRO-Offload's check passes


def test_zenflow_with_its_cores_share_set_is_a_point_of_its_own(tmp_path: Path) -> None:
    # two ZenFlow settings are two points, not repeats of one: the faster is the bar
    zenflow = {"stage": 2, "zenflow": {"topk_ratio": 0.05}}
    runs = [_run("zenflow", [300.0] * 4, zero=zenflow),
            _run("zenflow", [200.0] * 4,
                 zero={**zenflow, "zenflow": {"topk_ratio": 0.05, "pt_reserved_cores_perc": 0.25}}),
            _run("hpcmem", [150.0] * 4)]
    records = tmp_path / "hf.jsonl"
    records.write_text("".join(json.dumps(run) + "\n" for run in runs))
    (table,) = rows(benchmark_points(aggregate([records], tmp_path / "summary").summary,
                                     "peers")).values()
    by_label = {row.label: row for row in table}
    plain = by_label["DeepSpeed ZenFlow (ZeRO-2 + offload_optimizer cpu)"]
    cores = by_label[plain.label + ", pt_reserved_cores_perc 0.25"]
    assert (plain.each_ms, cores.each_ms) == ((300,), (200,))
    assert cores.key.endswith("/ptcores=0.25") and "ptcores" not in plain.key
    assert by_label["hpcmem, gpu_budget"].vs_best == pytest.approx(150 / 200)


def test_a_work_with_records_without_a_mean_compares_on_the_median(tmp_path: Path) -> None:
    # one record of the work from before the mean: every point is compared on the median,
    # and ZenFlow's median step makes it the fastest peer
    records = _records(ZENFLOW)
    old = next(r for r in records if r["variant"] == "cuda")
    old["step_ms"] = {key: v for key, v in old["step_ms"].items() if key != "mean"}
    mixed = tmp_path / "hf.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary, page = tmp_path / "summary", tmp_path / "report.html"
    assert main(["aggregate", str(mixed), "--out", str(summary)]) == 0
    assert main(["report", str(summary), "--out", str(page)]) == 0
    (table,) = rows(benchmark_points(aggregate([mixed], tmp_path / "again").summary,
                                     "peers")).values()
    zenflow = _step(records, "zenflow", "llama-0.9b")
    for row in table:
        assert row.basis == "mixed" and row.fastest_peer.startswith("DeepSpeed ZenFlow")
        if row.variant != "hpcmem":
            assert row.step_ms == pytest.approx(_step(records, row.variant, "llama-0.9b"))
        assert row.vs_best == pytest.approx(row.step_ms / zenflow)
    assert "some of these records time no mean, so every point is compared on the median" in (
        _section(page))
    with (summary / "peers_step_time.csv").open() as written:
        assert {line["step_basis"] for line in csv.DictReader(written)} == {"mixed"}


def test_the_smallest_budget_sets_hpcmems_floor_beside_each_peers_peak(tmp_path: Path) -> None:
    def offload(floor: int) -> dict:
        return {"offload": {"strategy": "host_optimizer", "probe_bytes": floor}}

    refused = {"status": "failed", "reason": "BudgetTooSmallError: gpu_budget: below"}
    runs = [  # batch 8: every kind of entry; 16: a refusal only; 32: no floor recorded
        _run("cuda", [50.0], checkpointing=False, nvml_peak_bytes=30 * GIB,
             peak_reserved_bytes=28 * GIB),
        _run("deepspeed", [400.0], peak_reserved_bytes=9 * GIB),
        {**_run("fsdp2", [1.0]), "status": "failed", "reason": "OutOfMemoryError: CUDA oom"},
        {**_run("hpcmem", [130.0]), **refused, "gpu_budget": 6 * GIB,
         "budget_minimum_bytes": int(7.5 * GIB)},
        {**_run("hpcmem", [130.0]), "gpu_budget": 10 * GIB, "memory": offload(int(7.25 * GIB))},
        {**_run("hpcmem", [1.0]), **refused, "batch": 16, "budget_minimum_bytes": int(6.5 * GIB)},
        _run("megatrain", [900.0], checkpointing=False, batch=32, nvml_peak_bytes=18 * GIB),
        {**_run("hpcmem", [1.0]), "batch": 32, "status": "failed", "reason": "RuntimeError: x"},
    ]
    records, summary, page = tmp_path / "hf.jsonl", tmp_path / "summary", tmp_path / "r.html"
    records.write_text("".join(json.dumps(run) + "\n" for run in runs))
    assert main(["aggregate", str(records), "--out", str(summary)]) == 0
    assert main(["report", str(summary), "--out", str(page)]) == 0
    section = _section(page)
    figure = section[section.index("The smallest budget</h3>"):]
    assert "alt=\"peers: hpcmem&#x27;s least budget against each peer&#x27;s peak" in figure
    shown = [[cell.split(">", 1)[1] for cell in row.split("</td>")[:-1]]
             for row in figure.split("<tr>")[2:]]
    assert shown == [
        ["m, bf16, 8 x 1024 tokens per step", "hpcmem: least budget accepted", "7.25",
         "the probe&#x27;s floor in a run it accepted (10.00 GiB budget)"],
        ["m, bf16, 8 x 1024 tokens per step", "cuda, no limit", "30.00", "NVML per-process peak"],
        ["m, bf16, 8 x 1024 tokens per step", "DeepSpeed ZeRO-2 + offload_optimizer cpu",
         "9.00", "PyTorch reserved peak (no NVML)"],
        ["m, bf16, 8 x 1024 tokens per step", "FSDP2 + CPUOffloadPolicy", "-",
         "failed: OutOfMemoryError: CUDA oom"],
        ["m, bf16, 16 x 1024 tokens per step", "hpcmem: least budget accepted", "6.50",
         "the probe&#x27;s floor in a run it refused (8.00 GiB budget)"],
        ["m, bf16, 32 x 1024 tokens per step", "hpcmem: least budget accepted", "-",
         "unknown: no run recorded the probe&#x27;s floor"],
        ["m, bf16, 32 x 1024 tokens per step", "MegaTrain, layers streamed from host memory",
         "18.00", "NVML per-process peak"],
    ]
    read = read_summary(summary)
    drawn = bars(benchmark_points(read.points, "peers"), benchmark_points(read.skipped, "peers"))
    for work, said in zip(drawn, (["failed (the table says why)"], [], ["floor unknown"]),
                          strict=True):
        _figure, (axes,) = new_figure(4, 3)
        draw(axes, drawn[work])
        assert [text.get_text().strip() for text in axes.texts
                if not text.get_text().strip()[0].isdigit()] == said
