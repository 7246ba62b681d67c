"""Summarize benchmarks/gpu records: step times, budget curves, and the targets they meet.

Usage: python benchmarks/gpu/summarize.py RECORDS.jsonl [--plot CURVE.png] [> summary.md]

The figure per variant is the median over repeats of each run's median step time (ms). A
budget curve plots step time against the GPU memory a variant held: the peak GPU-resident
bytes of a budgeted run, PyTorch's peak reserved bytes otherwise.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from hpcmem.record.jsonl import read_records

GiB = 2**30


def model_name(record: dict[str, Any]) -> str:
    """``transformer 0.34B b16`` or ``cnn b256 fp32``."""
    if record["model"] == "transformer":
        return f"transformer {record['params'] / 1e9:.2f}B b{record['batch']}"
    return f"cnn b{record['batch']} {record['dtype']}"


def variant(record: dict[str, Any]) -> str:
    """The policy's name, with ``@fraction`` of the footprint for a run under a budget."""
    name = record["policy"]["name"]
    fraction = record.get("budget_fraction")
    return f"{name}@{fraction:g}" if fraction else name


def gpu_bytes(record: dict[str, Any]) -> int | None:
    """What the run held on the GPU at most."""
    return record.get("peak_gpu_resident_bytes") or record.get("peak_reserved_bytes")


def _median(records: list[dict[str, Any]], key: Any) -> float:
    return statistics.median(key(r) for r in records)


def _step(record: dict[str, Any]) -> float:
    return record["step_ms"]["median"]


def group_runs(records: list[dict[str, Any]]) -> tuple[dict, list[str]]:
    """Finished runs by (group, model, variant), and a line per unfinished run."""
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    failed = []
    for record in records:
        key = (record.get("group", ""), model_name(record), variant(record))
        if record["status"] != "ok":
            failed.append(f"- {' '.join(key)}: {record['status']}: {record['reason']}")
        else:
            runs[key].append(record)
    return runs, failed


def steps_table(runs: dict) -> list[str]:
    lines = ["| group | model | variant | runs | step ms | spread | vs cuda | vs um "
             "| GPU GiB | escaped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (group, model, name), group_records in sorted(runs.items()):
        if group == "sequence" or "@" in name:
            continue
        m = _median(group_records, _step)
        spread = [_step(r) for r in group_records]
        cuda, um = (runs.get((group, model, v)) for v in ("cuda", "um"))
        memory = gpu_bytes(group_records[0])
        lines.append(
            f"| {group} | {model} | {name} | {len(group_records)} | {m:.2f} "
            f"| {min(spread):.2f}-{max(spread):.2f} | {_ratio(m, cuda)} | {_ratio(m, um)} "
            f"| {memory / GiB if memory else 0:.1f} "
            f"| {sorted({str(r.get('escaped_bytes')) for r in group_records})} |"
        )
    return lines


def budget_table(runs: dict) -> list[str]:
    lines = ["| model | variant | budget GiB | GPU GiB (peak) | step ms | PCIe bound ms "
             "| step/bound | H2D GB/step | D2H GB/step | vs FSDP2 offload | escaped |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (group, model, name), group_records in sorted(runs.items()):
        if group != "budget":
            continue
        m = _median(group_records, _step)
        fsdp = runs.get((group, model, "fsdp2_cpu_offload"))
        first = group_records[0]
        row = [model, name, f"{first['gpu_budget'] / GiB:.2f}" if first.get("gpu_budget") else "—",
               f"{max(gpu_bytes(r) or 0 for r in group_records) / GiB:.2f}", f"{m:.1f}"]
        if "pcie_bound_ms" in first:
            bound = _median(group_records, lambda r: r["pcie_bound_ms"])
            row += [f"{bound:.1f}", f"{m / bound:.2f}",
                    f"{_median(group_records, lambda r: r['bytes_h2d']) / 1e9:.2f}",
                    f"{_median(group_records, lambda r: r['bytes_d2h']) / 1e9:.2f}"]
        else:
            row += ["—"] * 4
        row += [_ratio(m, fsdp), str(sorted({str(r.get("escaped_bytes")) for r in group_records}))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def verdicts(runs: dict) -> list[str]:
    out = []
    medians = {key: _median(value, _step) for key, value in runs.items()}
    for (group, model, name), group_records in sorted(runs.items()):
        fraction = group_records[0].get("budget_fraction")
        if group == "budget" and fraction:
            m = medians[(group, model, name)]
            bound = _median(group_records, lambda r: r["pcie_bound_ms"])
            budget = group_records[0]["gpu_budget"]
            peak = max(r["peak_gpu_resident_bytes"] for r in group_records)
            fsdp = medians.get((group, model, "fsdp2_cpu_offload"))
            text = (f"- {model} budget {fraction:g} of the footprint ({1 / fraction:.1f}x): "
                    f"{m:.0f} ms = {m / bound:.2f}x its PCIe bound ({bound:.0f} ms); peak "
                    f"{peak / budget:.1%} of the budget")
            if fsdp:
                text += f"; {'faster' if m < fsdp else 'SLOWER'} than FSDP2 offload ({fsdp:.0f} ms)"
            out.append(text)
        if name == "hpcmem" and group != "sequence":
            cuda, um = medians.get((group, model, "cuda")), medians.get((group, model, "um"))
            m = medians[(group, model, name)]
            if cuda:
                out.append(f"- {group} {model}: hpcmem {m / cuda:.3f}x cuda")
            if um:
                out.append(f"- {group} {model}: hpcmem {(um - m) / um:+.1%} faster than um")
    sequence = [r for (g, _, n), rs in runs.items() if g == "sequence" for r in rs]
    if sequence:
        order = sorted(sequence, key=lambda r: r["sequence"])
        jobs = ", ".join(f"{variant(r)} {_step(r):.1f}" for r in order)
        hp = [_step(r) for r in order if variant(r) == "hpcmem"]
        out.append(f"- jobs in one process (ms): {jobs}; hpcmem spread "
                   f"{(max(hp) - min(hp)) / min(hp):.1%}")
    return out


def plot(runs: dict, path: str) -> None:
    """Step time against GPU memory, one panel per budgeted model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({m for g, m, _ in runs if g == "budget"})
    if not models:
        return
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models, strict=True):
        curve = []
        for (group, m, name), group_records in runs.items():
            if group != "budget" or m != model:
                continue
            point = (max(gpu_bytes(r) or 0 for r in group_records) / GiB,
                     _median(group_records, _step))
            if "@" in name:
                curve.append(point)
            else:
                axis.scatter(*point, label=name, s=50)
        if curve:
            xs, ys = zip(*sorted(curve), strict=True)
            axis.plot(xs, ys, "o-", label="hpcmem, budget 10-100% of the footprint")
        axis.set(title=model, xlabel="GPU memory held (GiB)", ylabel="step time (ms)",
                 yscale="log")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _ratio(value: float, reference: list[dict[str, Any]] | float | None) -> str:
    if isinstance(reference, list):
        reference = _median(reference, _step)
    return f"{value / reference:.3f}x" if reference else "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--plot", help="write the budget curves here (PNG)")
    args = parser.parse_args()
    runs, failed = group_runs(read_records(args.records))
    print("\n".join(steps_table(runs)))
    print()
    print("\n".join(budget_table(runs)))
    print()
    print("\n".join(verdicts(runs) + failed))
    if args.plot:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
