"""The offload anchors' records: Hugging Face models trained beyond the GPU by each tool.

``benchmarks/gpu/hf_offload.py`` runs one variant per process (``cuda``, DeepSpeed
ZeRO-Offload, ZeRO-3 with parameter offload, FSDP2 CPU offload, hpcmem under a budget) and
appends one JSON record each. This module reads such a file, every line checked, and makes
one row per variant and work per step (model, dtype, tokens per micro-batch, micro-batches
per step): medians over repeats, the ratios to ZeRO-Offload (its fastest run, with or
without checkpointing) and to ``cuda``, and how far the
losses strayed from ``cuda``'s. ``benchmarks/gpu/hf_table.py`` prints the rows as Markdown,
``hpcmem report --offload`` draws them (:mod:`hpcmem.train.offload_section`).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcmem.textfiles import read_text

__all__ = ["CHECKPOINTED", "VARIANTS", "Row", "Work", "base_variant", "markdown", "read_records",
           "rows", "shown", "variant_key"]

#: hf_offload.py's variants, in the tables' order
VARIANTS = ("cuda", "deepspeed", "deepspeed3", "fsdp2", "hpcmem")
#: the variants that recompute activations (gradient checkpointing) unless told otherwise
CHECKPOINTED = ("deepspeed", "deepspeed3", "fsdp2")
LABELS = {"cuda": "cuda, no limit", "deepspeed": "DeepSpeed ZeRO-2 + offload_optimizer cpu",
          "deepspeed3": "DeepSpeed ZeRO-3 + offload_param and offload_optimizer cpu",
          "fsdp2": "FSDP2 + CPUOffloadPolicy", "hpcmem": "hpcmem, gpu_budget"}
GIB = 2**30


@dataclass(frozen=True, order=True)
class Work:
    """What one optimizer step does: the variants of one table did the same."""

    model: str
    dtype: str
    batch: int
    seq_len: int
    accumulate: int

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.batch * self.seq_len * self.accumulate

    def title(self) -> str:
        micro = f" x {self.accumulate} micro-batches" if self.accumulate > 1 else ""
        return f"{self.model}, {self.dtype}, {self.batch} x {self.seq_len} tokens{micro} per step"


@dataclass(frozen=True)
class Row:
    """One variant's runs of one work: medians over its repeats (None: not measured)."""

    key: str  # the variant and what set it apart (:func:`variant_key`)
    label: str
    checkpointing: bool | None
    budget: int | None  # bytes
    each_ms: tuple[float, ...]  # each repeat's median step
    step_ms: float | None
    tokens_per_s: float | None
    allocated: float | None  # PyTorch's peak allocated bytes
    reserved: float | None  # PyTorch's peak reserved bytes
    nvml: float | None  # NVML's per-process peak
    held: float | None  # NVML's figure and managed bytes on the GPU
    vs_zero: float | None  # step time over the fastest ZeRO-Offload run's (deepspeed)
    vs_cuda: float | None
    loss_gap: float | None  # the largest relative distance from cuda's loss at any step
    loss_steps: int  # the steps the loss gap compared
    failed: str | None  # why, when no run of the variant succeeded
    accounting: str | None  # hpcmem's per-step accounting

    @property
    def gpu_bytes(self) -> float | None:
        """The GPU memory the variant held: all the process held where measured, else
        what PyTorch reserved."""
        return next((v for v in (self.held, self.nvml, self.reserved) if v), None)


def _fail(path: os.PathLike | str, line: int, what: str) -> ValueError:
    return ValueError(f"{path}:{line}: {what}")


#: a record's optional byte counts: a number at least 0, or null
BYTE_FIELDS = ("gpu_budget", "peak_allocated_bytes", "peak_reserved_bytes", "nvml_peak_bytes",
               "held_peak_bytes")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _share(value: Any) -> bool:
    """a share from 0 to 1"""
    return _is_number(value) and 0 <= value <= 1


def _threads(value: Any) -> bool:
    """a whole number of threads, at least 1"""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _name(value: Any) -> bool:
    """a name"""
    return isinstance(value, str)


#: the Offload settings variant_key reads, and what each accepts (its docstring says)
OFFLOAD_FIELDS = {"gpu_share": _share, "threads": _threads, "host_kernel": _name,
                  "state_dtype": _name}


def _check(record: Any, path: os.PathLike | str, line: int) -> dict[str, Any]:
    """``record`` when it is an hf_offload.py record, else a ValueError naming the field."""
    if not isinstance(record, dict):
        raise _fail(path, line, f"{type(record).__name__} where a record (a JSON object) "
                                "of benchmarks/gpu/hf_offload.py is accepted")
    if record.get("variant") not in VARIANTS:
        raise _fail(path, line, f"variant={record.get('variant')!r}: one of "
                                f"{', '.join(VARIANTS)} is accepted")
    if not isinstance(record.get("model"), str) or not record["model"]:
        raise _fail(path, line, f"model={record.get('model')!r}: a model's name is accepted")
    for field in ("batch", "seq_len", "accumulate"):
        value = record.get(field, 1 if field == "accumulate" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _fail(path, line, f"{field}={value!r}: a whole number, at least 1, is accepted")
    for field in BYTE_FIELDS:
        value = record.get(field)
        if value is not None and not (_is_number(value) and value >= 0):
            raise _fail(path, line, f"{field}={value!r}: a number of bytes, or null, is accepted")
    if not isinstance(record.get("dtype", "bf16"), str):
        raise _fail(path, line, f"dtype={record['dtype']!r}: a dtype's name is accepted")
    offload = record.get("offload")
    if offload is not None and not isinstance(offload, dict):
        raise _fail(path, line, f"offload={offload!r}: hpcmem's Offload settings (an "
                                "object), or null, are accepted")
    for field, accepted in OFFLOAD_FIELDS.items():
        value = (offload or {}).get(field)
        if value is not None and not accepted(value):
            raise _fail(path, line, f"offload.{field}={value!r}: {accepted.__doc__}, or null, "
                                    "is accepted")
    losses = record.get("losses")
    if losses is not None and not (isinstance(losses, list) and all(map(_is_number, losses))):
        raise _fail(path, line, f"losses={losses!r}: a list of numbers, or null, is accepted")
    if not isinstance(record.get("status"), str):
        raise _fail(path, line, f"status={record.get('status')!r}: ok, or a failure's word, "
                                "is accepted")
    timing = record.get("step_ms")
    step = timing.get("median") if isinstance(timing, dict) else None
    if record["status"] == "ok" and not (_is_number(step) and step > 0):
        raise _fail(path, line, f"step_ms={timing!r}: an ok record's step_ms is accepted with "
                                "a median above 0 ms")
    if record["status"] == "ok" and record["variant"] == "hpcmem" and not isinstance(
            record.get("memory"), dict):
        raise _fail(path, line, f"memory={record.get('memory')!r}: an ok hpcmem record's "
                                "memory statistics (an object) are accepted")
    return record


def read_records(path: os.PathLike | str) -> list[dict[str, Any]]:
    """The records of an hf_offload.py output (JSON lines; blank lines skipped); a
    ValueError names the line, the field and its value, and what is accepted (a
    TextFileError, the file that cannot be read as text)."""
    records = []
    for number, text in enumerate(read_text(path).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise _fail(path, number, f"not JSON ({error.msg} at column {error.colno})") from None
        records.append(_check(record, path, number))
    if not records:
        raise ValueError(f"{path}: no records (JSON lines of benchmarks/gpu/hf_offload.py)")
    return records


def variant_key(record: Mapping[str, Any]) -> str:
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


def base_variant(key: str) -> str:
    """The hf_offload.py variant of a :func:`variant_key`."""
    return re.split(r"[-@~%:+]", key)[0]


def _label(key: str) -> str:
    checkpointing = re.search(r"-(no)?ckpt", key)
    share = re.search(r"~([0-9.e-]+)", key)
    threads = re.search(r":(\d+)", key)
    kernel = re.search(r"%(\w+)", key)
    return (LABELS[base_variant(key)]
            + (f", {'no ' if checkpointing.group(1) else ''}checkpointing" if checkpointing
               else "")
            + (f", GPU share {share.group(1)} asked" if share else "")
            + (f", {kernel.group(1)} host kernel" if kernel else "")
            + (", delayed update" if "+delayed" in key else "")
            + (", moments in bf16" if "+bf16state" in key else "")
            + (f", {threads.group(1)} host threads" if threads else ""))


def _median(records: Iterable[Mapping[str, Any]],
            read: Callable[[Mapping[str, Any]], Any]) -> float | None:
    values = [v for v in (read(r) for r in records) if v is not None]
    return statistics.median(values) if values else None


def loss_gap(losses: list[float] | None, reference: list[float] | None
             ) -> tuple[float | None, int]:
    """The largest relative difference of ``losses`` from ``reference`` over the steps both
    ran (the same seed and data: the first steps agree in count), and how many those were."""
    steps = min(len(losses or ()), len(reference or ()))
    if not steps:
        return None, 0
    pairs = zip(losses[:steps], reference[:steps], strict=True)
    return max(abs(a - b) / abs(b) if b else math.inf for a, b in pairs), steps


def shown(value: float | None, form: str, scale: float = 1, unit: str = "",
          missing: str | None = "—") -> str | None:
    """``value / scale`` in ``form`` with ``unit`` after it; ``missing`` for None."""
    return missing if value is None else format(value / scale, form) + unit


def _ms(value: float | None) -> str:
    return shown(value, ".1f")


def _gib(value: float | None) -> str:
    return shown(value, ".2f", GIB)


def accounting(ours: list[Mapping[str, Any]]) -> str:
    """hpcmem's per-step accounting, medians over its runs ("—" for what a record lacks)."""
    def offload(record: Mapping[str, Any]) -> Mapping[str, Any]:
        found = record["memory"].get("offload")
        return found if isinstance(found, dict) else {}

    def field(key: str) -> float | None:
        return _median(ours, lambda r: _finite(offload(r).get(key)))

    def gigabytes(key: str) -> str:
        return f"{(field(key) or 0) / 1e9:.2f}"

    first, settings = ours[0]["memory"], offload(ours[0])
    resident = _gib(_median(ours, lambda r: _finite(r["memory"].get("peak_gpu_resident_bytes"))))
    escaped = f"escaped {first.get('escaped_bytes', '—')} bytes"
    if settings.get("strategy") == "stream":
        return (f"per step: strategy stream, H2D {gigabytes('bytes_h2d')} GB, D2H "
                f"{gigabytes('bytes_d2h')} GB, their PCIe time at the measured rates "
                f"{_ms(field('pcie_transfer_ms'))} ms; GPU-resident peak {resident} GiB; {escaped}")
    split = settings.get("split") if isinstance(settings.get("split"), dict) else {}
    shared = (f", the GPU steps {split['share']:.0%} ({split.get('why')})"
              if _finite(split.get("share")) else "")
    return (f"per step: strategy {settings.get('strategy', '—')}{shared}, "
            f"H2D {gigabytes('bytes_h2d')} GB ({_ms(field('h2d_busy_ms'))} ms busy), "
            f"D2H {gigabytes('bytes_d2h')} GB ({_ms(field('d2h_busy_ms'))} ms busy), "
            f"compute {_ms(field('compute_ms'))} ms (backward {_ms(field('backward_ms'))}), "
            f"CPU optimizer {_ms(field('cpu_optimizer_ms'))} ms "
            f"({settings.get('host_threads')} threads), bound {_ms(field('step_bound_ms'))} ms; "
            f"GPU-resident peak {resident} GiB; {escaped}")


def _finite(value: Any) -> float | None:
    """``value`` where it is a finite number, else None."""
    return value if _is_number(value) else None


def _work(record: Mapping[str, Any]) -> Work:
    return Work(record["model"], record.get("dtype", "bf16"), record["batch"],
                record["seq_len"], record.get("accumulate", 1))


def rows(records: Iterable[Mapping[str, Any]]) -> dict[Work, list[Row]]:
    """One row per variant key and work, in the records' order of works and
    :data:`VARIANTS`' order within each."""
    grouped: dict[Work, dict[str, list[Mapping[str, Any]]]] = {}
    for record in records:
        grouped.setdefault(_work(record), {}).setdefault(variant_key(record), []).append(record)
    tables = {}
    for work, variants in grouped.items():
        ok = {key: [r for r in runs if r.get("status") == "ok"] for key, runs in variants.items()}
        step = {key: _median(runs, lambda r: r["step_ms"]["median"]) for key, runs in ok.items()}
        zero = min((ms for key, ms in step.items() if ms and base_variant(key) == "deepspeed"),
                   default=None)
        reference = next(iter(ok.get("cuda") or ()), {}).get("losses")
        table = []
        for key in sorted(variants, key=lambda k: (VARIANTS.index(base_variant(k)), k)):
            runs = ok[key]
            gaps = [loss_gap(r.get("losses"), reference) for r in runs]
            measured = [gap for gap in gaps if gap[0] is not None]
            table.append(Row(
                key=key, label=_label(key),
                checkpointing=variants[key][0].get("checkpointing"),
                budget=variants[key][0].get("gpu_budget"),
                each_ms=tuple(r["step_ms"]["median"] for r in runs), step_ms=step[key],
                tokens_per_s=work.tokens / step[key] * 1e3 if step[key] else None,
                allocated=_median(runs, lambda r: r.get("peak_allocated_bytes")),
                reserved=_median(runs, lambda r: r.get("peak_reserved_bytes")),
                nvml=_median(runs, lambda r: r.get("nvml_peak_bytes")),
                held=_median(runs, lambda r: r.get("held_peak_bytes")),
                vs_zero=step[key] / zero if step[key] and zero else None,
                vs_cuda=step[key] / step["cuda"] if step[key] and step.get("cuda") else None,
                loss_gap=statistics.median(g for g, _ in measured) if measured else None,
                loss_steps=min((n for _, n in measured), default=0),
                failed=None if runs else str(variants[key][-1].get("reason", "failed")),
                accounting=accounting(runs) if runs and base_variant(key) == "hpcmem" else None,
            ))
        tables[work] = table
    return tables


def markdown(records: Iterable[Mapping[str, Any]]) -> str:
    """One table per work, then each hpcmem variant's accounting."""
    lines: list[str] = []
    for work, table in rows(records).items():
        lines += [f"## {work.title()}", "",
                  "| variant | checkpointing | budget GiB | step ms (repeats) | tokens/s | GiB "
                  "allocated / reserved | NVML GiB | held GiB | vs fastest ZeRO-Offload | "
                  "vs cuda | loss vs cuda, most (steps) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in table:
            if row.failed is not None:
                lines.append(f"| {row.label} | | | {row.failed[:120]} | | | | | | | |")
                continue
            each = ", ".join(_ms(ms) for ms in row.each_ms)
            lines.append(
                f"| {row.label} | {row.checkpointing} | {_gib(row.budget)} | "
                f"**{_ms(row.step_ms)}** ({each}) | {row.tokens_per_s:,.0f} | "
                f"{_gib(row.allocated)} / {_gib(row.reserved)} | {_gib(row.nvml)} | "
                f"{_gib(row.held)} | {shown(row.vs_zero, '.2f', unit='x')} | "
                f"{shown(row.vs_cuda, '.2f', unit='x')} | "
                f"{shown(row.loss_gap, '.3%', unit=f' ({row.loss_steps})')} |")
        for row in table:
            if row.accounting:
                lines += ["", f"{row.label} at {_gib(row.budget)} GiB, {row.accounting}"]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
