"""The tables of ``hf_offload.py``'s records: per work and variant, the median over repeats.

    python benchmarks/gpu/hf_table.py hf.jsonl > hf.md

``hpcmem report SUMMARY --offload hf.jsonl --out report.html`` draws the same rows.
"""

from __future__ import annotations

import sys

from hpcmem.train.offload_anchors import markdown, read_records


def main(argv: list[str]) -> int:
    sys.stdout.write(markdown(read_records(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
