"""Aggregation streams its input: the memory it adds stays well below the input's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "records" / "collectives" / "rep1.jsonl"
INPUT_BYTES = 24 * 2**20

MEASURE = """
import resource, sys
from hpcmem.results.aggregate import aggregate
aggregate([sys.argv[1]], sys.argv[3])  # imports and caches warmed up on a small input
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = aggregate([sys.argv[2]], sys.argv[4])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(after - before, result.metadata["records"]["ok"], len(result.summary))
"""


def _generate(path: Path) -> int:
    """Records of 64 points, each repeated in many runs, up to INPUT_BYTES; their count."""
    template = json.loads(FIXTURE.open().readline())
    written = count = 0
    with path.open("w") as handle:
        while written < INPUT_BYTES:
            record = dict(template, run_id=f"run{count // 64}",
                          timestamp=f"2026-01-01T00:00:{count % 60:02d}+00:00",
                          size_bytes=8 << (count % 64 % 16), ranks=2 + count % 64 // 16)
            line = json.dumps(record) + "\n"
            handle.write(line)
            written += len(line)
            count += 1
    return count


def test_peak_memory_stays_well_below_the_input_size(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    count = _generate(big)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(FIXTURE), str(big), str(tmp_path / "warm"),
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, check=True,
    )
    added_kib, ok, points = map(int, done.stdout.split())
    assert (ok, points) == (count, 64)
    print(f"{added_kib / 1024:.0f} MiB added for {big.stat().st_size / 2**20:.0f} MiB of records")
    added = added_kib * 1024
    assert added < 0.5 * big.stat().st_size, f"{added / 2**20:.0f} MiB for a 24 MiB input"
