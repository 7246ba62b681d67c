"""The tables of ``hf_offload.py``'s records as Markdown: per work, one row per variant and
settings, medians over repeats.

    python benchmarks/gpu/hf_table.py hf.jsonl > hf.md

The records are read as ``hpcmem aggregate`` reads them (the peers, :mod:`hpcmem.peers`);
``hpcmem aggregate hf.jsonl --out S && hpcmem report S --out report.html`` draws the same
rows. A line aggregate would reject is printed with its file, line and reason, and no
table (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcmem.peers.tables import markdown, rows
from hpcmem.results.aggregate import load_records, summarize
from hpcmem.results.summary import benchmark_points


def main(argv: list[str]) -> int:
    loaded = load_records(map(Path, argv))
    for line in loaded.rejected:
        print(f"{line['file']}:{line['line']}: {line['error']}", file=sys.stderr)
    if not loaded.rejected and not loaded.ok:
        print(f"{', '.join(argv)}: no ok records of hf_offload.py", file=sys.stderr)
    if loaded.rejected or not loaded.ok:
        return 2
    sys.stdout.write(markdown(rows(benchmark_points(summarize(loaded), "peers"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
