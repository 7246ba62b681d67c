"""A nightly-sized collectives sweep for the report: 15 series (5 buffer kinds x 3
bindings) of 4 sizes each, 60 points, over several nights judged against their history.

Records are the fixture record of ``tests/fixtures/records/collectives`` with their point,
repeats and node state replaced; latencies are made up (deterministic), shaped like a
2-rank shared-memory run on emulated HBW. On the last night one series is 2.5x slower
(a regression the history catches), one series is new (nothing to judge it against), one
point's repeats disagree (ringed as noisy) and the ``none`` binding shared its cores.
"""

from __future__ import annotations

import io
import json
import random
from contextlib import redirect_stdout
from pathlib import Path

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate

FIXTURE = Path(__file__).parent / "fixtures" / "records" / "collectives" / "rep1.jsonl"
REPO = Path(__file__).resolve().parents[1]
BUFFERS = ("numpy", "hbw", "hbw_preferred", "hbw_interleave", "mpi_alloc")
BINDINGS = ("none", "cores", "hbw")
SIZES = (8, 1024, 65536, 1048576)
NIGHTS = 4
#: the series the last night slows down, and the one it measures first
SLOWED = ("hbw_interleave", "cores")
ADDED = ("mpi_alloc", "hbw")
#: the point whose repeats disagree on the last night
SPREAD = ("numpy", "none", 1024)


def run_id(night: int) -> str:
    """A run id as the nightly writes them: long enough that a cut one shows."""
    return f"20261{201 + night}T083015Z-nightly"


def _latency(buffer: str, binding: str, size: int, rng: random.Random) -> float:
    base = 1.3 + size / 4e3
    factor = 1 + 0.03 * BUFFERS.index(buffer) + 0.05 * BINDINGS.index(binding)
    return base * factor * rng.uniform(0.95, 1.05)


def _record(template: dict, night: int, buffer: str, binding: str, size: int,
            rng: random.Random) -> dict:
    record = json.loads(json.dumps(template))
    last = night == NIGHTS - 1
    middle = _latency(buffer, binding, size, rng) * (2.5 if last and (buffer, binding) == SLOWED
                                                     else 1.0)
    repeats = []
    scales = (rng.uniform(0.9, 0.98), 1.0, rng.uniform(1.02, 1.2))
    if last and (buffer, binding, size) == SPREAD:
        scales = (0.6, 1.0, 2.0)
    for scale in scales:
        value = middle * scale
        busbw = size / value / 1e3
        repeats.append({"latency_us": {"avg": value, "min": value * 0.9, "max": value * 1.1},
                        "algbw_GBps": busbw, "busbw_GBps": busbw})
    shared = last and binding == "none"
    record.update(
        run_id=run_id(night), timestamp=f"2026-12-{2 + night:02d}T08:30:15+00:00",
        op="allreduce", buffer=buffer, size_bytes=size, repeats=repeats,
        latency_us=repeats[1]["latency_us"], algbw_GBps=repeats[1]["algbw_GBps"],
        busbw_GBps=repeats[1]["busbw_GBps"],
        binding={"cpus": [0], "membind": None, "name": binding, "numactl": None},
        placement={"emulated": True, "hbw_fraction": 0.0 if buffer == "numpy" else 1.0,
                   "nodes": {"0": 1}},
        node={"cpus": 2, "processes": 2, "load_before": None, "load_after": None,
              "other_busy_cpus": 1.4 if shared else 0.0, "shared_cores": shared,
              "governor": None, "yield_when_idle": False})
    return record


def night_summary(base: Path, night: int) -> Path:
    """One night's 60 points, aggregated; its summary folder."""
    template = json.loads(FIXTURE.read_text().splitlines()[0])
    rng = random.Random(night)
    records = [_record(template, night, buffer, binding, size, rng)
               for buffer in BUFFERS for binding in BINDINGS for size in SIZES
               if night == NIGHTS - 1 or (buffer, binding) != ADDED]
    folder = base / run_id(night)
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    aggregate([folder], folder / "summary")
    return folder / "summary"


def sweep_report(base: Path, nights: int = NIGHTS,
                 references: Path = REPO / "config" / "references.yaml") -> Path:
    """The report of the last of ``nights``, each night checked against ``references`` and
    the nights before it, as the nightly does; the report's path."""
    for night in range(nights):
        summary = night_summary(base, night)
        verdict = summary.parent / "verdict.json"
        with redirect_stdout(io.StringIO()):  # the verdict table: in verdict.json too
            main(["check", str(summary), "--references", str(references), "--system",
                  "lab:p", "--history", str(base / "history"), "--verdict-out", str(verdict)])
    out = summary.parent / "report.html"
    assert main(["report", str(summary), "--verdict", str(verdict), "--out", str(out)]) == 0
    return out


if __name__ == "__main__":  # a report to look at: python tests/report_sweep.py FOLDER
    import sys

    print(sweep_report(Path(sys.argv[1])))
