"""benchmarks/gpu/hf_offload.py data-parallel, on CPUs: what it refuses before importing
torch, the ranks' figures merged into one record (in-process, and over gloo between the
ranks of a real ``torchrun``), the budget taken per GPU, and GPU counts as points of their
own, with the scaling from one GPU, through ``hpcmem aggregate``, ``check`` and ``report``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAUNCH, REPO, torchrun

from hpcmem.cli import main
from hpcmem.peers.tables import Work, rows
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import benchmark_points

GPU_DIR = REPO / "benchmarks" / "gpu"
SCRIPT = GPU_DIR / "hf_offload.py"
RANKS = Path(__file__).with_name("hf_dp_ranks.py")
REFERENCES = REPO / "config" / "references.yaml"
GIB = 2**30
TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}
SRUN = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2"}


def _module(name: str):
    """A module beside hf_offload.py, as the script imports it (torch stays unimported)."""
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    return importlib.import_module(name)


def _script():
    spec = importlib.util.spec_from_file_location("hf_offload_dp_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(**launch: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in LAUNCH}, **launch}


def _refused(tmp_path: Path, launch: dict[str, str], *args: str) -> str:
    out = tmp_path / "hf.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)],
                          env=_env(**launch), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert not out.exists()  # nothing written
    return done.stderr.splitlines()[-1]


NO_RENDEZVOUS = {k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}


@pytest.mark.parametrize(("launch", "args", "said"), [
    ({}, ("--variant", "hpcmem", "--world-size", "2"),
     "--world-size 2: no ranks were started (neither torchrun's RANK, LOCAL_RANK, WORLD_SIZE "
     "nor srun's SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS); run it under torchrun "
     "--nproc-per-node 2"),
    ({}, ("--variant", "cuda", "--world-size", "0"),
     "--world-size 0: a whole number, at least 1, is accepted"),
    (TORCHRUN, ("--variant", "deepspeed", "--world-size", "4"),
     "--world-size 4: torchrun started 2 ranks (WORLD_SIZE=2)"),
    ({**TORCHRUN, "RANK": "2"}, ("--variant", "fsdp2"),
     "RANK=2: a rank below the world size (2) is accepted"),
    ({**TORCHRUN, "LOCAL_RANK": "one"}, ("--variant", "fsdp2"),
     "LOCAL_RANK='one': a whole number is accepted, as torchrun sets it"),
    (NO_RENDEZVOUS, ("--variant", "cuda"),
     "MASTER_ADDR is unset: the ranks meet at MASTER_ADDR:MASTER_PORT (torchrun sets them; "
     "under srun export the first node's address and a free port)"),
    (SRUN, ("--variant", "cuda", "--world-size", "2"), "MASTER_ADDR is unset"),
    (TORCHRUN, ("--variant", "torchao"),
     "--variant torchao runs one process, not 2 ranks: torchao's CPUOffloadOptimizer steps "
     "one process's parameters, with no data-parallel form"),
    (TORCHRUN, ("--variant", "cuda", "--trace", "step.json.gz"),
     "--trace profiles one process, not 2 ranks"),
    (TORCHRUN, ("--variant", "hpcmem", "--budget-gib", "8", "--delayed-update"),
     "--delayed-update runs with one rank, not 2: hpcmem's data parallelism steps every "
     "shard on the host"),
    (TORCHRUN, ("--variant", "hpcmem", "--budget-gib", "8", "--gpu-share", "0.1"),
     "--gpu-share runs with one rank, not 2"),
    # the batch is per GPU; ZenFlow's accumulation is its update interval on every GPU count
    (TORCHRUN, ("--variant", "zenflow", "--accumulate", "8", "--world-size", "2"),
     "--accumulate runs with zenflow at 1 only: DeepSpeed takes ZenFlow's gradient "
     "accumulation from its update_interval (4)"),
])
def test_what_ranks_cannot_run_is_refused_before_anything_runs(
        tmp_path: Path, launch: dict[str, str], args: tuple[str, ...], said: str) -> None:
    last = _refused(tmp_path, launch, *args)
    assert last.startswith("hf_offload.py: error: ") and said in last, last


def test_the_launchers_variables_give_the_rank() -> None:
    ranks = _module("hf_ranks")
    launch = ranks.launch_of(None, TORCHRUN)
    assert launch == ranks.Launch(0, 0, 2, "torchrun")
    assert launch.command() == "torchrun --nproc-per-node 2"
    srun = ranks.launch_of(2, {**SRUN, "MASTER_ADDR": "node1", "MASTER_PORT": "29500"})
    assert srun == ranks.Launch(1, 1, 2, "srun") and srun.command() == "srun --ntasks 2"
    # a single process inside a Slurm allocation stays one, unless --world-size asks
    assert ranks.launch_of(None, SRUN) is None and ranks.launch_of(None, {}) is None
    # one rank may ask what several cannot
    one = ranks.launch_of(1, {**TORCHRUN, "WORLD_SIZE": "1"})
    assert ranks.refused_parallel("hpcmem", one, trace=False, delayed_update=True,
                                  gpu_share=0.1) is None


def _rank(rank: int, times: list[float], **fields: object) -> dict:
    return {"rank": rank, "status": "ok", "reason": None, "times": times,
            "losses": [10.0 + rank, 9.0 + rank], "peak_allocated_bytes": GIB,
            "peak_reserved_bytes": 2 * GIB, "nvml_peak_bytes": 3 * GIB,
            "held_peak_bytes": None, "host_peak_bytes": 20 * GIB, **fields}


def test_ranks_merge_on_the_slowest_rank_per_step() -> None:
    ranks = _module("hf_ranks")
    # the slowest rank differs from step to step: each step's time is its slowest rank's
    results = [_rank(0, [900.0, 100.0, 130.0, 100.0]),
               _rank(1, [800.0, 120.0, 100.0, 101.0], peak_reserved_bytes=5 * GIB),
               _rank(2, [950.0, 110.0, 100.0, 140.0], nvml_peak_bytes=6 * GIB,
                     host_peak_bytes=21 * GIB)]
    merged = ranks.merge(results, warmup=1, tokens_per_step=8 * 1024, budget=4 * GIB)
    assert merged["world_size"] == 3 and merged["status"] == "ok" and "reason" not in merged
    assert merged["step_ms_all"] == [950.0, 120.0, 130.0, 140.0]
    assert merged["tokens_per_s"] == pytest.approx(3 * 8 * 1024 / 130.0 * 1e3)
    assert merged["losses"] == [11.0, 10.0]  # each step's mean over the ranks
    assert (merged["peak_reserved_bytes"], merged["nvml_peak_bytes"]) == (5 * GIB, 6 * GIB)
    assert merged["held_peak_bytes"] is None and merged["host_peak_bytes"] == 21 * GIB
    assert merged["budget_exceeded_ranks"] == [1, 2]
    assert [r["step_ms"]["mean"] for r in merged["ranks"]] == pytest.approx(
        [110.0, 107.0, 350 / 3])
    assert [r["peak_reserved_bytes"] for r in merged["ranks"]] == [2 * GIB, 5 * GIB, 2 * GIB]
    assert ranks.least_reserved(merged) == 2 * GIB
    assert ranks.least_reserved({"peak_reserved_bytes": 7}) == 7


def test_a_failed_rank_fails_the_record_naming_it() -> None:
    ranks = _module("hf_ranks")
    results = [_rank(0, [100.0, 100.0]),
               _rank(1, [], status="failed", losses=None,
                     reason="OutOfMemoryError: CUDA out of memory")]
    merged = ranks.merge(results, warmup=1, tokens_per_step=1024, budget=None)
    assert merged["status"] == "failed"
    assert merged["reason"] == "rank 1: OutOfMemoryError: CUDA out of memory"
    assert merged["step_ms_all"] == [] and "tokens_per_s" not in merged
    assert merged["losses"] is None and merged["budget_exceeded_ranks"] == []


def test_torchrun_ranks_hand_their_figures_to_rank_zero_over_gloo(tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    done = torchrun(2, str(RANKS), str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(out.read_text())
    assert written["launch"] == {"rank": 0, "local_rank": 0, "world_size": 2,
                                 "launcher": "torchrun"}
    merged = written["merged"]
    assert merged["world_size"] == 2 and merged["status"] == "ok"
    assert merged["step_ms_all"] == [10.0 * (i + 1) + 1 for i in range(6)]  # rank 1's
    assert merged["losses"] == [0.5 + i for i in range(6)]
    assert merged["peak_reserved_bytes"] == 3 * GIB and merged["host_peak_bytes"] == 11 * GIB
    assert merged["budget_exceeded_ranks"] == []  # rank 1's NVML peak is 4 GiB, the budget
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]


def test_the_budget_is_the_least_either_peer_reserved_on_as_many_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "hf.jsonl"
    base = {"model": "llama-3b", "status": "ok", "accumulate": 1, "dtype": "bf16",
            "checkpointing": True}
    lines = [{**base, "variant": "deepspeed", "world_size": 2, "peak_reserved_bytes": 12 * GIB,
              "ranks": [{"peak_reserved_bytes": 11 * GIB}, {"peak_reserved_bytes": 10 * GIB}]},
             {**base, "variant": "zenflow", "world_size": 2, "peak_reserved_bytes": 13 * GIB,
              "ranks": [{"peak_reserved_bytes": 9 * GIB}, {"peak_reserved_bytes": 13 * GIB}]},
             {**base, "variant": "deepspeed", "peak_reserved_bytes": 5 * GIB},  # one GPU
             {**base, "variant": "zenflow", "world_size": 4, "peak_reserved_bytes": 4 * GIB}]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    script = _script()
    args = script._args(["--variant", "hpcmem", "--model", "llama-3b", "--world-size", "2",
                         "--budget-from", "deepspeed,zenflow", "--out", str(out)])
    assert script._budget(args) == 9 * GIB
    args.budget_from = "deepspeed"
    assert script._budget(args) == 10 * GIB
    args.accumulate = 8  # neither ran it: the fallback
    assert script._budget(args) is None
    monkeypatch.delenv("WORLD_SIZE")
    single = script._args(["--variant", "hpcmem", "--model", "llama-3b", "--budget-from",
                           "deepspeed,zenflow", "--budget-scale", "0.5", "--out", str(out)])
    assert single.launch is None and script._budget(single) == int(2.5 * GIB)


#: step ms per variant and GPU count (ZeRO-Offload slows as it communicates more)
STEPS = {("deepspeed", 1): 1000.0, ("deepspeed", 2): 1050.0, ("deepspeed", 4): 1100.0,
         ("hpcmem", 1): 400.0, ("hpcmem", 2): 420.0, ("hpcmem", 4): 500.0}
#: hpcmem's budget per GPU: taken from ZeRO-Offload's reserved bytes, a little different
#: on every GPU count
BUDGETS = {1: 8.0 * GIB, 2: 7.9 * GIB, 4: 7.8 * GIB}


def _dp_record(variant: str, world: int, step: float, budget: float | None = None) -> dict:
    """A record as hf_offload.py's rank 0 writes it: every rank's figures merged."""
    ranks, steps = _module("hf_ranks"), _module("hf_steps")
    results = [_rank(r, [step * 3] + [step - r] * 4, host_peak_bytes=(40 / world + r) * GIB)
               for r in range(world)]
    merged = ranks.merge(results, warmup=1, tokens_per_step=8 * 1024 * 8,
                         budget=None if budget is None else int(budget))
    record = {"variant": variant, "model": "llama-3b", "batch": 8, "accumulate": 8,
              "steps": 5, "dtype": "bf16", "seq_len": 1024, "checkpointing": variant != "hpcmem",
              "gpu_budget": None if budget is None else int(budget), "repeat": 1,
              "git": "0" * 40, "date": "2026-12-06T19:00:00Z", **merged,
              "step_ms": steps.step_ms(merged["step_ms_all"], 1)}
    if variant == "hpcmem":
        record["memory"] = {"offload": None}
    return record


def test_gpu_counts_are_points_of_their_own_with_their_scaling(tmp_path: Path) -> None:
    records = [_dp_record(variant, world, step, BUDGETS[world] if variant == "hpcmem" else None)
               for (variant, world), step in STEPS.items()]
    # hpcmem at another budget on one GPU: the 2- and 4-GPU points scale from the nearest
    records.append(_dp_record("hpcmem", 1, 600.0, 4 * GIB))
    path = tmp_path / "hf-dp.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    summary, page, verdict = tmp_path / "summary", tmp_path / "report.html", tmp_path / "v.json"
    assert main(["aggregate", str(path), "--out", str(summary)]) == 0
    assert main(["check", str(summary), "--references", str(REFERENCES),
                 "--verdict-out", str(verdict)]) == 0
    assert main(["report", str(summary), "--verdict", str(verdict), "--out", str(page)]) == 0
    with (summary / "summary.csv").open() as table:
        points = {row["point"]: row for row in csv.DictReader(table)}
    prefix = "peers/llama-3b/bf16/batch=8/accum=8/seq=1024"
    assert f"{prefix}/deepspeed/ckpt=True/budget=none" in points  # one GPU: the key as before
    for world in (2, 4):
        zero = points[f"{prefix}/gpus={world}/deepspeed/ckpt=True/budget=none"]
        assert float(zero["scaling_efficiency"]) == pytest.approx(1000 / STEPS["deepspeed", world])
        assert zero["world_size"] == str(world)
        assert float(zero["host_peak_bytes"]) == pytest.approx((40 / world + world - 1) * GIB)
        (ours,) = [row for key, row in points.items()
                   if key.startswith(f"{prefix}/gpus={world}/hpcmem/")]
        assert float(ours["scaling_efficiency"]) == pytest.approx(400 / STEPS["hpcmem", world])
        assert float(ours["vs_zero_offload"]) == pytest.approx(
            STEPS["hpcmem", world] / STEPS["deepspeed", world])
        assert float(ours["tokens_per_s"]) == pytest.approx(
            world * 8 * 1024 * 8 / STEPS["hpcmem", world] * 1e3)
    tables = rows(benchmark_points(aggregate([path], tmp_path / "again").summary, "peers"))
    assert sorted(tables) == [Work("llama-3b", "bf16", 8, 1024, 8, world) for world in (1, 2, 4)]
    for work, table_rows in tables.items():
        for row in table_rows:  # over all GPUs, as the record's own figure
            record = next(r for r in records if r["variant"] == row.variant
                          and r["world_size"] == work.world_size
                          and r["step_ms"]["mean"] == row.step_ms)
            assert row.tokens_per_s == pytest.approx(record["tokens_per_s"])
    section = _section(page)
    assert 'alt="peers: tokens/s against GPUs"' in section
    assert "llama-3b, bf16, 8 x 1024 tokens x 8 micro-batches per GPU per step, 4 GPUs" in section
    assert section.count("vs 1 GPU") == 2 and f"{400 / 500:.0%}" in section
    with (summary / "peers_step_time.csv").open() as table:
        written = list(csv.DictReader(table))
    assert {line["world_size"] for line in written} == {"1", "2", "4"}
    assert all(line["scaling_efficiency"] for line in written)
    done = subprocess.run([sys.executable, str(GPU_DIR / "hf_table.py"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    parallel = {line: lines[index + 2].endswith("| host GiB | vs 1 GPU |")
                for index, line in enumerate(lines) if line.startswith("## ")}
    assert parallel == {f"## {work.title()}": work.world_size > 1 for work in tables}


def _section(page: Path) -> str:
    text = page.read_text()
    section = text[text.index('id="peers"'):]
    return section[:section.index("</section>")]
