"""The table of ``hf_offload.py``'s records: per model and variant, the median over repeats.

    python benchmarks/gpu/hf_table.py hf.jsonl > hf.md
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from hf_offload import CHECKPOINTED  # beside this file: each variant's default --checkpointing

GIB = 2**30
ORDER = ("cuda", "deepspeed", "deepspeed3", "fsdp2", "hpcmem")
LABELS = {"cuda": "cuda, no limit", "deepspeed": "DeepSpeed ZeRO-2 + offload_optimizer cpu",
          "deepspeed3": "DeepSpeed ZeRO-3 + offload_param and offload_optimizer cpu",
          "fsdp2": "FSDP2 + CPUOffloadPolicy", "hpcmem": "hpcmem, gpu_budget"}
CHECKPOINTING = {"-ckpt": "checkpointing", "-nockpt": "no checkpointing"}


def _median(records: list[dict[str, Any]], read) -> float | None:
    values = [v for v in (read(r) for r in records) if v is not None]
    return statistics.median(values) if values else None


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def accounting(ours: list[dict[str, Any]]) -> str:
    """hpcmem's per-step accounting, medians over its runs."""
    def field(key: str) -> float | None:
        return _median(ours, lambda r: r["memory"]["offload"].get(key))

    first = ours[0]["memory"]
    resident = _median(ours, lambda r: r["memory"]["peak_gpu_resident_bytes"])
    if first["offload"]["strategy"] == "stream":
        return (f"hpcmem per step: strategy stream, H2D {(field('bytes_h2d') or 0) / 1e9:.2f} GB,"
                f" D2H {(field('bytes_d2h') or 0) / 1e9:.2f} GB, their PCIe time at the "
                f"measured rates {_ms(field('pcie_transfer_ms'))} ms; GPU-resident peak "
                f"{_gib(resident)} GiB; escaped {first['escaped_bytes']} bytes")
    split = first["offload"].get("split") or {}
    shared = f", the GPU steps {split['share']:.0%} ({split['why']})" if split.get("share") else ""
    return (f"hpcmem per step: strategy {first['offload']['strategy']}{shared}, "
            f"H2D {(field('bytes_h2d') or 0) / 1e9:.2f} GB ({_ms(field('h2d_busy_ms'))} ms busy), "
            f"D2H {(field('bytes_d2h') or 0) / 1e9:.2f} GB ({_ms(field('d2h_busy_ms'))} ms busy), "
            f"compute {_ms(field('compute_ms'))} ms (backward {_ms(field('backward_ms'))}), "
            f"CPU optimizer "
            f"{_ms(field('cpu_optimizer_ms'))} ms ({first['offload'].get('host_threads')} "
            f"threads), bound {_ms(field('step_bound_ms'))} ms; GPU-resident peak "
            f"{_gib(resident)} GiB; escaped {first['escaped_bytes']} bytes")


def loss_gap(losses: list[float] | None, reference: list[float] | None) -> float | None:
    """The largest relative difference of ``losses`` from ``reference``, step by step (None
    unless both have the same number of steps)."""
    if not losses or not reference or len(losses) != len(reference):
        return None
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.3%}"


def _variant(record: dict[str, Any]) -> str:
    """The record's row: its variant; ``-ckpt`` or ``-nockpt`` after it where its
    checkpointing was not the variant's default; for hpcmem ``@`` its budget in GiB, ``~``
    the GPU share asked for, ``%`` the host optimizer's kernel, ``+delayed`` the delayed
    update, ``+bf16state`` moments kept in bf16 and ``:`` its threads, where set."""
    name = record["variant"]
    checkpointing = record.get("checkpointing")
    if checkpointing is not None and checkpointing != (name in CHECKPOINTED):
        name += "-ckpt" if checkpointing else "-nockpt"
    if record.get("gpu_budget"):
        name += f"@{record['gpu_budget'] / GIB:.2f}"
    offload = record.get("offload") or {}
    if offload.get("gpu_share") is not None:
        name += f"~{offload['gpu_share']:g}"
    if offload.get("host_kernel"):
        name += f"%{offload['host_kernel']}"
    if offload.get("delayed_update"):
        name += "+delayed"
    if offload.get("state_dtype") == "bfloat16":
        name += "+bf16state"
    threads = offload.get("threads")
    return f"{name}:{threads}" if threads else name


def _base(variant: str) -> str:
    """The hf_offload.py variant of a ``_variant`` key."""
    return re.split(r"[-@~%:+]", variant)[0]


def _label(variant: str) -> str:
    checkpointing = re.search(r"-(no)?ckpt", variant)
    share = re.search(r"~([0-9.e-]+)", variant)
    threads = re.search(r":(\d+)", variant)
    kernel = re.search(r"%(\w+)", variant)
    return (LABELS[_base(variant)]
            + (f", {CHECKPOINTING[checkpointing.group(0)]}" if checkpointing else "")
            + (f", GPU share {share.group(1)} asked" if share else "")
            + (f", {kernel.group(1)} host kernel" if kernel else "")
            + (", delayed update" if "+delayed" in variant else "")
            + (", moments in bf16" if "+bf16state" in variant else "")
            + (f", {threads.group(1)} host threads" if threads else ""))


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: one table per model and work per step, then the hpcmem accounting."""
    lines = []
    by_model: dict[tuple[str, int, int, int, int | None, str],
                   dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        work = (record["model"], record["batch"], record["seq_len"], record.get("accumulate", 1),
                record.get("steps"), record.get("dtype", "bf16"))
        by_model[work][_variant(record)].append(record)
    for (model, batch, seq_len, accumulate, steps, dtype), variants in by_model.items():
        ok = {v: [r for r in rs if r["status"] == "ok"] for v, rs in variants.items()}
        step = {v: _median(rs, lambda r: r["step_ms"]["median"]) for v, rs in ok.items()}
        reference = (ok.get("cuda") or [{}])[0].get("losses")
        tokens = batch * seq_len * accumulate
        micro = f" x {accumulate} micro-batches" if accumulate > 1 else ""
        counted = f", {steps} steps" if steps else ""
        lines += [f"## {model}, {dtype}, {batch} x {seq_len} tokens{micro} per step{counted}", "",
                  "| variant | checkpointing | budget GiB | step ms (repeats) | tokens/s | GiB "
                  "allocated / reserved | NVML GiB | held GiB | vs ZeRO-Offload | vs cuda | "
                  "loss vs cuda, most |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for variant in sorted(variants, key=lambda v: (ORDER.index(_base(v)), v)):
            runs = ok.get(variant, [])
            if not runs:
                failed = variants.get(variant, [])
                if failed:
                    lines.append(f"| {_label(variant)} | | | {failed[-1].get('reason', '')[:120]}"
                                 " | | | | | | | |")
                continue
            each = ", ".join(_ms(r["step_ms"]["median"]) for r in runs)
            ratio = {base: (f"{step[variant] / step[base]:.2f}x" if step.get(base) else "—")
                     for base in ("deepspeed", "cuda")}
            lines.append(
                f"| {_label(variant)} | {runs[0]['checkpointing']} | "
                f"{_gib(runs[0].get('gpu_budget'))} | **{_ms(step[variant])}** ({each}) | "
                f"{tokens / step[variant] * 1e3:,.0f} | "
                f"{_gib(_median(runs, lambda r: r['peak_allocated_bytes']))} / "
                f"{_gib(_median(runs, lambda r: r['peak_reserved_bytes']))} | "
                f"{_gib(_median(runs, lambda r: r.get('nvml_peak_bytes')))} | "
                f"{_gib(_median(runs, lambda r: r.get('held_peak_bytes')))} | "
                f"{ratio['deepspeed']} | {ratio['cuda']} | "
                f"{_percent(_median(runs, lambda r, c=reference: loss_gap(r.get('losses'), c)))}"
                " |")
        for variant in sorted(v for v in ok if _base(v) == "hpcmem" and ok[v]):
            lines += ["", f"{_label(variant)} at {_gib(ok[variant][0]['gpu_budget'])} GiB, "
                      + accounting(ok[variant]).removeprefix("hpcmem "), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    records = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line]
    sys.stdout.write(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
