"""The workflow end to end on the local profile: real snakemake, Open MPI, memkind, pandas.

A copy of ``.test/config`` (2 ranks bound to the emulated HBW node, allreduce and bcast on
numpy and HBW buffers, one training point that is skipped without a GPU) runs through build,
collectives, aggregate, check and report; then a regression and killed jobs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from html import escape
from pathlib import Path

import pandas as pd
import psutil
import pytest

from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record

pytestmark = pytest.mark.mpi

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN = Path("results", "e2e")
#: a collectives point slow enough to be killed mid-run
SLOW = "collectives:\n  iterations: 1000000\n  warmup: 0\n  max_size: 1M\n"


def command(workdir: Path, *args: str) -> list[str]:
    """The snakemake command line of the local profile in ``workdir``."""
    return [str(BIN / "snakemake"), "--profile", str(REPO / "profiles" / "local"),
            "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
            *args]


def environment() -> dict[str, str]:
    """The environment `make run` gives the workflow: the project's venv first on PATH
    (HBW nodes come from the config's emulate_hbw only)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MEMKIND_HBW_NODES", None)
    return env


def snakemake(workdir: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """Run the workflow to completion; stdout holds all of snakemake's output."""
    return subprocess.run(command(workdir, *args), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env=environment(), cwd=REPO)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding a copy of the tiny test config (shared by this module)."""
    work = tmp_path_factory.mktemp("workflow")
    shutil.copytree(REPO / ".test" / "config", work / "config")
    return work


def test_end_to_end_on_the_local_profile(workdir: Path):
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    result = snakemake(workdir)
    assert result.returncode == 0, result.stdout
    run = workdir / RUN

    manifest = json.loads((run / "build" / "manifest.json").read_text())
    assert "hpcmem._hbw" in manifest["native_modules"] and manifest["git_sha"] == head
    assert (run / "build" / "wheelhouse" / manifest["wheel"]).is_file()

    for op, buffer in itertools.product(("allreduce", "bcast"), ("numpy", "hbw")):
        point = run / "collectives" / op / buffer / "ranks=2"
        records = read_records(point / "binding=hbw.jsonl")
        assert [validate_record(r) for r in records] == [[]] * len(records)
        assert {r["status"] for r in records} == {"ok"}
        assert sorted(r["size_bytes"] for r in records) == [2**k for k in range(3, 11)]
        assert all(r["validated"] and r["ranks"] == 2 and r["run_id"] == "e2e" for r in records)
        assert all(r["op"] == op and r["buffer"] == buffer for r in records)
        assert {r["git_sha"] for r in records} == {head}
        assert {r["container"] for r in records} == {None}  # no runtime here: native
        if buffer == "hbw":
            assert all(r["placement"]["emulated"] for r in records)
            assert all(r["placement"]["hbw_fraction"] == 1.0 for r in records)
        for rank in (rank for r in records for rank in r["binding"]["per_rank"]):
            assert rank["name"] == "hbw"
            assert rank["mempolicy"] == {"mode": "bind", "nodes": [0]}  # measured in the rank
        osu = (point / "binding=hbw.osu.txt").read_text()
        assert f"# OSU MPI {'Allreduce' if op == 'allreduce' else 'Broadcast'}" in osu

    (train,) = read_records(run / "train" / "transformer" / "params=125000000" / "budget=none"
                            / "policy=hpcmem.jsonl")
    assert validate_record(train) == []
    assert train["status"] == "skipped" and "GPU" in train["reason"]
    assert train["container"] is None

    summary = pd.read_parquet(run / "summary" / "summary.parquet")
    assert len(summary) == 2 * 2 * 8  # op x buffer x size, each from the tools' own records
    skipped = pd.read_csv(run / "summary" / "skipped.csv")
    assert skipped["reason"].str.contains("GPU").any(), skipped

    assert (run / "check" / "exit_status").read_text().strip() == "0"
    assert (run / "check" / "verdict.txt").read_text().strip()
    html = (run / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2
    assert "skipped" in html
    assert f"hpcmem: report  {workdir / RUN / 'report' / 'report.html'}" in result.stdout
    assert f"hpcmem: verdict {workdir / RUN / 'check' / 'verdict.txt'}" in result.stdout


#: run argv[2:] once the file argv[1] exists: processes started so leave at one instant
AT_THE_BARRIER = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n"
                  "    time.sleep(0.001)\nos.execv(sys.argv[2], sys.argv[2:])\n")


@pytest.mark.parametrize("attempt", range(3))
def test_two_identical_runs_started_at_once_run_one(workdir: Path, tmp_path: Path, attempt):
    # the same command twice in one folder, leaving a barrier together: one run redoes
    # the point, the other is refused before it builds or installs anything
    target = RUN / "collectives" / "bcast" / "numpy" / "ranks=2" / "binding=hbw.jsonl"
    go = tmp_path / "go"
    same = command(workdir, "--forcerun", "run_collectives", "--", str(target))
    runs = [subprocess.Popen([sys.executable, "-c", AT_THE_BARRIER, str(go), *same],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=environment(), cwd=REPO) for _ in range(2)]
    time.sleep(0.5)
    before = sorted(p for p in workdir.rglob("*") if p.is_file() and "e2e" not in p.parts)
    go.touch()
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    statuses = sorted(run.returncode for run in runs)
    assert statuses == [0, 2], outputs
    done, refused = (outputs[i] for i in sorted(range(2), key=lambda i: runs[i].returncode))
    assert done.count("rule run_collectives:") == 1 and "rule build_wheel" not in done
    first = runs[outputs.index(done)].pid  # the barrier's process became snakemake
    assert refused.splitlines()[-1].startswith(
        f"hpcmem: error: run folder {RUN}: in use by another run of the workflow (snakemake "
        f"process {first} on "), refused
    assert "Building DAG" not in refused and "rule " not in refused
    assert {r["status"] for r in read_records(workdir / target)} == {"ok"}
    assert not (workdir / RUN / "run.lock").exists()
    after = sorted(p for p in workdir.rglob("*") if p.is_file() and "e2e" not in p.parts)
    assert [p for p in after if ".snakemake" not in p.parts] == [
        p for p in before if ".snakemake" not in p.parts]  # nothing made outside the run


def test_regression_fails_the_run_after_writing_report_and_verdict(workdir: Path):
    (workdir / "config" / "strict.yaml").write_text(
        'references:\n  "*:*":\n    "collectives/*/latency_us.avg": [0.001, null, 0.0, us]\n'
        "history:\n  shared_cores: judge\n"  # judged even on a busy node: this run must fail
    )
    result = snakemake(workdir, "--config", "check={references: config/strict.yaml}")
    assert result.returncode == 1, result.stdout
    assert "hpcmem check found a regression in run e2e" in result.stdout
    run = workdir / RUN
    assert (run / "check" / "exit_status").read_text().strip() == "1"
    assert "FAIL" in (run / "check" / "verdict.txt").read_text()
    assert (run / "report" / "report.html").is_file()
    assert "rule run_collectives" not in result.stdout  # finished points are not redone


def rank_processes(
    workflow: subprocess.Popen, workdir: Path, target: Path, timeout: float = 300
) -> list[psutil.Process]:
    """The two MPI ranks of ``workflow`` writing ``target`` (in ``workdir``), once they print."""
    osu_pattern = target.stem + ".osu.txt.*.tmp"  # the job's own temporary name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if workflow.poll() is not None:
            raise AssertionError(f"the workflow ended early:\n{workflow.communicate()[0]}")
        ranks = []
        for process in psutil.process_iter(["cmdline", "cwd"]):
            cmdline = process.info["cmdline"] or []
            if (process.info["cwd"] == str(workdir) and str(target) in cmdline
                    and "collectives" in cmdline and "bind" not in cmdline):
                ranks.append(process)
        written = [osu for osu in (workdir / target.parent).glob(osu_pattern)
                   if osu.stat().st_size > 0]
        if len(ranks) == 2 and written:
            return ranks
        time.sleep(0.2)
    raise AssertionError(f"the ranks writing {target} did not start in {timeout} s")


def start(workdir: Path, *args: str) -> subprocess.Popen:
    """Start the workflow in the background."""
    return subprocess.Popen(command(workdir, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=environment(), cwd=REPO)


def test_killed_points_leave_nothing_and_are_redone(workdir: Path):
    target = RUN / "collectives" / "gather" / "numpy" / "ranks=2" / "binding=none.jsonl"
    records = workdir / target
    osu = records.with_name("binding=none.osu.txt")
    (workdir / "config" / "slow.yaml").write_text(SLOW)
    configs = (workdir / "config" / "config.yaml", workdir / "config" / "slow.yaml")
    slow = ("--configfile", *map(str, configs))

    # A rank killed mid-run (as the OOM killer would): the job fails, nothing is kept.
    workflow = start(workdir, *slow, "--", str(target))
    rank_processes(workflow, workdir, target)[0].send_signal(signal.SIGKILL)
    output, _ = workflow.communicate(timeout=120)
    assert workflow.returncode == 1, output
    assert "Error in rule run_collectives" in output
    assert not records.exists() and not osu.exists()

    # The whole run killed (a lost node): snakemake, mpirun and the ranks at once.
    workflow = start(workdir, *slow, "--", str(target))
    ranks = rank_processes(workflow, workdir, target)
    tree = [psutil.Process(workflow.pid), *psutil.Process(workflow.pid).children(recursive=True)]
    assert set(ranks) <= set(tree)
    for process in tree:
        process.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=30)
    workflow.communicate(timeout=30)
    assert not records.exists() and not osu.exists()

    # The next run (after --unlock, as snakemake asks) redoes the point, and only it.
    assert snakemake(workdir, "--unlock").returncode == 0
    result = snakemake(workdir, "--", str(target))
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("rule run_collectives:") == 1
    assert {r["status"] for r in read_records(records)} == {"ok"}
    assert osu.read_text().startswith("# OSU MPI Gather")


def test_binding_the_node_cannot_provide_is_a_skipped_record(workdir: Path):
    # hbw bound memory without HBW nodes and no emulation asked for: the point still runs
    # (`hpcmem bind --skip-unavailable`) and says why it measured nothing.
    (workdir / "config" / "nohbw.yaml").write_text(
        "collectives:\n  ops: [reduce]\n  buffers: [numpy]\n  emulate_hbw: null\n"
        "train:\n  enabled: false\n"
    )
    configs = (workdir / "config" / "config.yaml", workdir / "config" / "nohbw.yaml")
    result = snakemake(workdir, "--configfile", *map(str, configs))
    # a sweep that measured nothing judges no figure: it fails, after its report and verdict
    assert result.returncode == 1, result.stdout
    assert "hpcmem check judged no figure in run e2e" in result.stdout
    run = workdir / RUN
    point = run / "collectives" / "reduce" / "numpy" / "ranks=2" / "binding=hbw.jsonl"
    records = read_records(point)
    assert [validate_record(r) for r in records] == [[]] * 8  # 8 B .. 1 KiB
    assert {r["status"] for r in records} == {"skipped"}
    reason = "binding 'hbw': this node has no high-bandwidth memory node"
    assert all(r["reason"].startswith(reason) for r in records)
    skipped = pd.read_csv(run / "summary" / "skipped.csv")
    assert len(skipped) == 8 and skipped["reason"].str.startswith(reason).all()
    assert escape(reason) in (run / "report" / "report.html").read_text()


#: the orphans of a killed run, as docs/workflow.md's recovery recipe finds them
ORPHANS = "hpcmem (bind|collectives|train)"


def test_recipe_right_after_kill_9_of_snakemake_keeps_every_finished_point(workdir: Path):
    (workdir / "config" / "steady.yaml").write_text(  # a few seconds a point
        "collectives:\n  iterations: 100000\n  warmup: 0\n  repeats: 1\n  max_size: 64\n")
    configs = ("--configfile", str(workdir / "config" / "config.yaml"),
               str(workdir / "config" / "steady.yaml"))
    points = sorted(path for op in ("allreduce", "bcast")  # the sweep of .test/config
                    for path in (workdir / RUN / "collectives" / op).rglob("binding=hbw.jsonl"))
    assert len(points) == 4
    for path in points:  # the sweep to do again
        path.unlink()
        path.with_name("binding=hbw.osu.txt").unlink()
    for step in ("summary", "report", "check"):
        shutil.rmtree(workdir / RUN / step)
    started = time.time()
    log = workdir / "killed-run.log"
    with log.open("w") as out:  # its own process group, as a shell's job control gives it
        workflow = subprocess.Popen(command(workdir, *configs), stdout=out,
                                    stderr=subprocess.STDOUT, env=environment(), cwd=REPO,
                                    start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        # a point finished (and Snakemake said so) while the next one runs
        if " steps (" in log.read_text() and _orphans(workflow.pid):
            break
        assert workflow.poll() is None, log.read_text()
        time.sleep(0.2)
    else:
        raise AssertionError(f"no point finished while another ran:\n{log.read_text()}")
    os.kill(workflow.pid, signal.SIGKILL)  # snakemake alone: its jobs live on
    workflow.wait(timeout=30)
    done_before = log.read_text().count(" steps (")
    kept = {p: p.read_bytes() for p in points if p.exists() and p.stat().st_mtime > started}
    assert len(kept) >= done_before >= 1

    # The recipe, at once: end the orphans' process group, unlock, rerun.
    found = subprocess.run(["pgrep", "-f", ORPHANS], capture_output=True, text=True)
    groups = {os.getpgid(int(pid)) for pid in found.stdout.split() if _alive(int(pid))}
    assert workflow.pid in groups  # the recipe finds the killed run's group
    subprocess.run(["kill", "-TERM", "--", f"-{workflow.pid}"], check=True)
    assert snakemake(workdir, "--unlock").returncode == 0
    result = snakemake(workdir, *configs)
    assert result.returncode == 0, result.stdout
    assert not _orphans(workflow.pid)
    for path in points:
        assert {r["status"] for r in read_records(path)} == {"ok"}, path
    # the points Snakemake saw finish are kept as they were, not redone
    assert result.stdout.count("rule run_collectives:") <= len(points) - done_before
    assert len([p for p, data in kept.items() if p.read_bytes() != data]) <= len(kept) - done_before
    # the terminated orphans removed their temporary files (SIGKILL alone leaves them)
    assert [tmp for path in points for tmp in path.parent.glob("*.tmp")] == []


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid)


def _orphans(group: int) -> list[psutil.Process]:
    """The hpcmem processes left in process group ``group``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(process.pid) == group and "collectives" in (process.info["cmdline"]
                                                                      or []):
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@contextlib.contextmanager
def on_a_full_disk(folder: Path) -> Iterator[Path]:
    """``folder``'s files on a small file system of their own (a tmpfs mounted over it, as
    root), filled to the last byte by the file it yields; skips where mounting is not
    allowed. The files made there go with the file system."""
    stage = folder.with_name(f"{folder.name}.before-full-disk")
    shutil.copytree(folder, stage, symlinks=True)  # modification times kept
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        shutil.rmtree(stage)
        pytest.skip(f"no small file system to fill here: {mounted.stderr.strip()}")
    try:
        shutil.copytree(stage, folder, symlinks=True, dirs_exist_ok=True)
        filler = folder / "filler"
        with filler.open("wb", buffering=0) as out:
            for chunk in (1 << 20, 4096, 1):
                with contextlib.suppress(OSError):  # ENOSPC: the next, smaller chunk
                    while True:
                        out.write(b"\0" * chunk)
        yield filler
    finally:
        subprocess.run(["umount", str(folder)], check=True)
        shutil.rmtree(stage)


def test_a_full_disk_during_aggregation_is_explained_on_the_terminal(workdir: Path):
    # the run folder fills before the summary is made: the step's own log stays empty,
    # so its error must reach the terminal; once there is room, only the summary is redone
    run = workdir / RUN
    history = {p: p.read_bytes() for p in (workdir / "results" / "history").rglob("*")
               if p.is_file()}
    steps = ("aggregate_results", "check_regressions", "render_report")
    for folder in ("summary", "check", "report"):  # to be made on the full disk
        shutil.rmtree(run / folder)
    for step in steps:
        (run / "logs" / f"{step}.log").unlink()
    with on_a_full_disk(run) as filler:
        full = snakemake(workdir)
        assert full.returncode == 1, full.stdout
        assert (f"hpcmem aggregate: error: --out: {RUN}/summary: cannot write in {RUN} (No "
                "space left on device)") in full.stdout  # amid Snakemake's own lines
        assert (run / "logs" / "aggregate_results.log").read_bytes() == b""
        assert "rule run_collectives" not in full.stdout and not (run / "summary").exists()
        filler.unlink()
        again = snakemake(workdir)
        assert again.returncode == 0, again.stdout
        assert "rule run_collectives" not in again.stdout  # finished points are never redone
        assert all(f"rule {step}:" in again.stdout for step in steps)
        assert (run / "check" / "verdict.json").is_file()
    assert {p: p.read_bytes() for p in (workdir / "results" / "history").rglob("*")
            if p.is_file()} == history  # the run was checked before: nothing appended
