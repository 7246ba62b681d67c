"""The tables of ``hf_offload.py``'s records as Markdown: per work, one row per variant and
settings, medians over repeats.

    python benchmarks/gpu/hf_table.py hf.jsonl > hf.md

The records are read as ``hpcmem aggregate`` reads them (the peers, :mod:`hpcmem.peers`);
``hpcmem aggregate hf.jsonl --out S && hpcmem report S --out report.html`` draws the same
rows. A point that did not train (a `failed` or `skipped` record: a peer out of memory, a
loss that went NaN, a budget refused) is listed after the tables with its reason. A line
aggregate would reject is printed with its file, line and reason, and no table (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hpcmem.peers.tables import markdown, rows
from hpcmem.results.aggregate import load_records, summarize
from hpcmem.results.summary import benchmark_points


def not_trained(left_out: list[dict[str, Any]]) -> str:
    """The points that did not train, each with its status and the first line of its reason."""
    lines = ["## Not trained", "", "| point | status | reason |", "|---|---|---|"]
    for record in left_out:
        reason = next(iter(str(record["reason"]).strip().splitlines()), "").replace("|", "/")
        lines.append(f"| {record['point']} | {record['status']} | {reason[:300]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    loaded = load_records(map(Path, argv))
    for line in loaded.rejected:
        print(f"{line['file']}:{line['line']}: {line['error']}", file=sys.stderr)
    if not loaded.rejected and not loaded.ok and not loaded.skipped:
        print(f"{', '.join(argv)}: no records of hf_offload.py", file=sys.stderr)
    if loaded.rejected or not (loaded.ok or loaded.skipped):
        return 2
    parts = [markdown(rows(benchmark_points(summarize(loaded), "peers")))] if loaded.ok else []
    if loaded.skipped:
        parts.append(not_trained(loaded.skipped))
    sys.stdout.write("\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
