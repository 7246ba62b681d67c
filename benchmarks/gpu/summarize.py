"""Summarize benchmarks/gpu records: step time per model and variant, and the issue's targets.

Usage: python benchmarks/gpu/summarize.py RECORDS.jsonl [> summary.md]
The figure per variant is the median over repeats of each run's median step time (ms).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from typing import Any

from hpcmem.results.records import read_records


def variant(record: dict[str, Any]) -> str:
    """The policy's name, with ``@budget`` for a run under a GPU budget."""
    name = record["policy"]["name"]
    return f"{name}@budget" if record.get("gpu_budget") else name


def table(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Markdown lines of the table, and the target verdict lines."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    failed = []
    for record in records:
        model = (
            f"{record['model']} {record.get('params', 0) / 1e9:.2f}B"
            if record["model"] == "transformer"
            else record["model"]
        )
        if record["status"] != "ok":
            failed.append(f"- {model} {variant(record)}: {record['status']}: {record['reason']}")
            continue
        runs[(model, variant(record))].append(record)
    lines = [
        "| model | variant | runs | step ms (median of medians) | spread of medians "
        "| first step ms | vs um | vs cuda | GPU budget GiB | escaped bytes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for key, group in sorted(runs.items()):
        medians[key] = statistics.median(r["step_ms"]["median"] for r in group)
    verdicts = []
    for (model, name), group in sorted(runs.items()):
        m = medians[(model, name)]
        spread = [r["step_ms"]["median"] for r in group]
        um, cuda = medians.get((model, "um")), medians.get((model, "cuda"))
        budget = group[0].get("gpu_budget")
        escaped = {r.get("escaped_bytes") for r in group}
        lines.append(
            f"| {model} | {name} | {len(group)} | {m:.2f} | {min(spread):.2f}-{max(spread):.2f} "
            f"| {statistics.median(r['first_step_ms'] for r in group):.0f} "
            f"| {_pct(m, um)} | {_pct(m, cuda)} | {f'{budget / 2**30:.1f}' if budget else '—'} "
            f"| {', '.join(map(str, sorted(escaped, key=str)))} |"
        )
    for model in sorted({m for m, _ in runs}):
        hp, um, cuda = (medians.get((model, v)) for v in ("hpcmem", "um", "cuda"))
        if hp and um:
            gain = (um - hp) / um * 100
            ok = gain >= 9.4 if model == "cnn" else hp <= um
            want = "≥ 9.4% below um" if model == "cnn" else "not above um"
            verdicts.append(
                f"- {model}: hpcmem {gain:+.1f}% below um (target {want}): "
                f"{'met' if ok else 'MISSED'}"
            )
        if hp and cuda:
            over = (hp - cuda) / cuda * 100
            verdicts.append(
                f"- {model}: hpcmem {over:+.1f}% vs cuda (target within 10%, aim 3%): "
                f"{'met' if over <= 10 else 'MISSED'}"
            )
        fsdp = medians.get((model, "fsdp2_cpu_offload"))
        for (mod, name), budgeted in sorted(medians.items()):
            if mod != model or not name.endswith("@budget"):
                continue
            if cuda:
                verdicts.append(f"- {model}: {name} {budgeted / cuda:.2f}x cuda's step time")
            if fsdp:
                verdicts.append(
                    f"- {model}: {name} {budgeted / fsdp:.2f}x FSDP2 CPU offload's step time "
                    f"({fsdp:.1f} ms)"
                )
    return lines, verdicts + failed


def _pct(value: float, reference: float | None) -> str:
    return f"{(value - reference) / reference * 100:+.1f}%" if reference else "—"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    lines, verdicts = table(read_records(argv[0]))
    print("\n".join(lines))
    print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
