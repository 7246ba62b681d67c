"""The peers' figures across points, their rows and their tables, from the summary.

A work is what one optimizer step does (model, dtype, batch, micro-batches per step,
sequence length, GPUs: the batch is per GPU): the variants of one table did the same. Its
points are compared on one step figure (:func:`compared`): each run's mean step, total time
over the timed steps (what a user pays for, and what tokens/s is), where every run of the
work timed it, else each run's median step (records made before the mean); the median over
repeats either way. A tool that does an expensive step every few steps (ZenFlow's
``update_interval``) has a median step that leaves those out.

:func:`derive` puts each point's step over the fastest ZeRO-Offload point's of its work
(``deepspeed``, with or without checkpointing), over the fastest peer tool's
(:data:`~hpcmem.peers.variants.TOOLS`) and over ``cuda``'s into the summary; :func:`rows`
reads each point as the report and the Markdown show it, :func:`step_time_table` is the
table ``hpcmem aggregate`` writes (``peers_step_time.csv``) and :func:`markdown` prints the
rows (``benchmarks/gpu/hf_table.py``). Across GPU counts, :func:`derive` also puts each
point's :data:`~hpcmem.peers.spec.SCALING` against the same variant's point on one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcmem.peers.spec import GIB, LOSS_VS_CUDA, SCALING, VS_BEST, VS_CUDA, VS_ZERO
from hpcmem.peers.variants import CHECKPOINTED, LABELS, TOOLS, VARIANTS
from hpcmem.record.samples import read_samples

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BASES", "GIB", "WORK", "Row", "Work", "basis_note", "compared", "derive", "label",
           "loss_shown", "markdown", "number", "rows", "scaling", "shown", "step_time_table",
           "work_of"]

STEP, MEAN = "step_ms.median", "step_ms.mean"
#: a work's step figure: the metric each basis reads. "mixed": some of the work's runs
#: timed no mean, so every point is compared on the median
BASES = {"mean": MEAN, "median": STEP, "mixed": STEP}
#: :func:`compared`'s columns: the work's basis, the point's step on it, and the fastest
#: peer tool's point key and step at the work
COMPARED = ["step_basis", "step_ms", "fastest_peer", "fastest_peer_ms"]
#: the summary's columns of a work, in :class:`Work`'s order
WORK = ["model", "dtype", "batch", "seq_len", "accumulate", "world_size"]
#: the columns that set a point apart within its work, in the key's order
SETTINGS = ["variant", "checkpointing", "gpu_budget", "gpu_share", "host_kernel",
            "delayed_update", "state_dtype", "threads", "pt_cores"]


@dataclass(frozen=True, order=True)
class Work:
    """What one optimizer step does: the variants of one table did the same."""

    model: str
    dtype: str
    batch: int
    seq_len: int
    accumulate: int
    world_size: int = 1  # GPUs, one rank each; the batch is per GPU

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step, over every GPU."""
        return self.batch * self.seq_len * self.accumulate * self.world_size

    def title(self) -> str:
        micro = f" x {self.accumulate} micro-batches" if self.accumulate > 1 else ""
        tokens = f"{self.model}, {self.dtype}, {self.batch} x {self.seq_len} tokens{micro}"
        if self.world_size == 1:
            return f"{tokens} per step"
        return f"{tokens} per GPU per step, {self.world_size} GPUs"


@dataclass(frozen=True)
class Row:
    """One point: one variant's runs of one work, medians over its repeats (None: not
    measured), its step on its work's basis."""

    key: str  # the point key
    variant: str
    label: str
    checkpointing: bool
    budget: int | None  # bytes
    basis: str  # the work's step figure: a key of BASES
    each_ms: tuple[float, ...]  # each repeat's step
    step_ms: float | None
    tokens_per_s: float | None
    allocated: float | None  # PyTorch's peak allocated bytes
    reserved: float | None  # PyTorch's peak reserved bytes
    nvml: float | None  # NVML's per-process peak
    held: float | None  # NVML's figure and managed bytes on the GPU
    vs_zero: float | None
    vs_best: float | None  # over the fastest peer tool's step
    fastest_peer: str | None  # that peer's label
    fastest_peer_ms: float | None  # and its step
    vs_cuda: float | None
    loss_vs_cuda: float | None  # the last loss's relative distance from cuda's
    loss_steps: float | None  # the steps the losses compared ran
    accounting: str | None  # hpcmem's per-step accounting
    host: float | None = None  # the largest resident host memory of a rank (data parallel)
    scaling: float | None = None  # against the same variant on one GPU

    @property
    def gpu_bytes(self) -> float | None:
        """The GPU memory the variant held: all the process held where measured, else
        what PyTorch reserved."""
        return next((v for v in (self.held, self.nvml, self.reserved) if v), None)


def number(value: Any) -> float | None:
    """``value`` as a float, None where it is missing or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _basis(work: pd.DataFrame) -> str:
    """The step figure of one work's points: "mean" where every run of every point timed
    its mean step, "mixed" where only some did, else "median"."""
    timed = [len(read_samples(text).get(MEAN) or ()) for text in work["samples"]]
    if all(n == repeats for n, repeats in zip(timed, work["repeats"], strict=True)):
        return "mean"
    return "mixed" if any(timed) else "median"


def compared(points: pd.DataFrame) -> pd.DataFrame:
    """Per point (:data:`COMPARED`, on ``points``' index): its work's basis, its step on
    that basis, and the key and step of the fastest peer tool's point of its work (None
    and NaN where the work has none)."""
    import pandas as pd

    table = pd.DataFrame(index=points.index, columns=COMPARED, dtype=object)
    for _, work in points.groupby(WORK, sort=False, dropna=False):
        basis = _basis(work)
        steps = pd.to_numeric(work[BASES[basis]], errors="coerce")
        peers = steps[work["variant"].isin(TOOLS)].dropna()
        fastest = peers.idxmin() if not peers.empty else None
        table.loc[work.index, "step_basis"] = basis
        table.loc[work.index, "step_ms"] = steps
        table.loc[work.index, "fastest_peer"] = (
            None if fastest is None else work.at[fastest, "point"])
        table.loc[work.index, "fastest_peer_ms"] = (
            math.nan if fastest is None else steps[fastest])
    return table


def derive(points: pd.DataFrame) -> pd.DataFrame:
    """Each point's step over the fastest ZeRO-Offload point's of its work, over the
    fastest peer tool's and over ``cuda``'s (without checkpointing), on the work's basis,
    its last loss's relative distance from ``cuda``'s after as many steps, and its
    :func:`scaling` from one GPU: the columns :data:`VS_ZERO`, :data:`VS_BEST`,
    :data:`VS_CUDA`, :data:`LOSS_VS_CUDA` and :data:`SCALING` on ``points``' index, NaN
    where the work has no such point."""
    import pandas as pd

    derived = pd.DataFrame(index=points.index,
                           columns=[VS_ZERO, VS_BEST, VS_CUDA, LOSS_VS_CUDA, SCALING], dtype=float)
    table = compared(points)
    derived[VS_BEST] = table["step_ms"].astype(float) / table["fastest_peer_ms"].astype(float)
    derived[SCALING] = scaling(points, table["step_ms"].astype(float))
    for _, work in points.groupby(WORK, sort=False, dropna=False):
        steps = table.loc[work.index, "step_ms"].astype(float)
        zero = steps[work["variant"] == "deepspeed"].min()
        derived.loc[work.index, VS_ZERO] = steps / zero if zero > 0 else math.nan
        cuda = work[(work["variant"] == "cuda") & ~work["checkpointing"].astype(bool)]
        if cuda.empty:
            continue
        reference = cuda.iloc[0]
        derived.loc[work.index, VS_CUDA] = steps / steps[cuda.index[0]]
        loss = pd.to_numeric(work["final_loss"], errors="coerce")
        gap = (loss - float(reference["final_loss"])).abs() / abs(float(reference["final_loss"]))
        derived.loc[work.index, LOSS_VS_CUDA] = gap.where(
            work["loss_steps"] == reference["loss_steps"])
    return derived


def scaling(points: pd.DataFrame, steps: pd.Series) -> pd.Series:
    """Each point's step on one GPU over its ``steps`` on its GPU count (1 on one GPU): the
    one-GPU point of the same variant, settings and work per GPU, of the nearest budget (a
    budget taken from another run's peak differs with the GPU count); NaN without one."""
    import pandas as pd

    alike = [c for c in (*WORK, *SETTINGS) if c not in ("world_size", "gpu_budget")]
    found = pd.Series(math.nan, index=points.index, dtype=float)
    budgets = pd.to_numeric(points["gpu_budget"], errors="coerce").fillna(0)
    for _, same in points.groupby(alike, sort=False, dropna=False):
        ones = same.index[pd.to_numeric(same["world_size"], errors="coerce") == 1]
        if ones.empty:
            continue
        for index in same.index:
            nearest = (budgets[ones] - budgets[index]).abs().idxmin()
            found[index] = steps[nearest] / steps[index]
    return found


def label(point: Mapping[str, Any]) -> str:
    """What the variant ran, with every setting that sets the point apart."""
    variant = point["variant"]
    notes = []
    if bool(point["checkpointing"]) != (variant in CHECKPOINTED):
        notes.append("checkpointing" if point["checkpointing"] else "no checkpointing")
    if point["gpu_share"] != "auto":
        notes.append(f"GPU share {point['gpu_share']} asked")
    if point["host_kernel"] != "auto":
        notes.append(f"{point['host_kernel']} host kernel")
    if bool(point["delayed_update"]):
        notes.append("delayed update")
    if point["state_dtype"] == "bfloat16":
        notes.append("moments in bf16")
    if point["threads"] != "auto":
        notes.append(f"{point['threads']} host threads")
    if point["pt_cores"] != "auto":
        notes.append(f"pt_reserved_cores_perc {point['pt_cores']}")
    return ", ".join([LABELS[variant], *notes])


def shown(value: float | None, form: str, scale: float = 1, unit: str = "",
          missing: str | None = "—") -> str | None:
    """``value / scale`` in ``form`` with ``unit`` after it; ``missing`` for None."""
    return missing if value is None else format(value / scale, form) + unit


def accounting(point: Mapping[str, Any]) -> str:
    """hpcmem's per-step accounting, medians over its runs ("—" for what they lack)."""
    def ms(name: str) -> str:
        return shown(number(point.get(name)), ".1f")

    def gigabytes(name: str) -> str:
        return shown(number(point.get(name)), ".2f", 1e9)

    share = number(point.get("gpu_step_share"))
    threads = number(point.get("host_threads"))
    resident = number(point.get("peak_gpu_resident_bytes"))
    return (f"per step: H2D {gigabytes('bytes_h2d')} GB ({ms('h2d_busy_ms')} ms busy), "
            f"D2H {gigabytes('bytes_d2h')} GB ({ms('d2h_busy_ms')} ms busy), "
            f"compute {ms('compute_ms')} ms (backward {ms('backward_ms')}), "
            f"CPU optimizer {ms('cpu_optimizer_ms')} ms "
            f"({shown(threads, '.0f')} threads), bound {ms('step_bound_ms')} ms"
            + (f", the GPU steps {share:.0%} of the elements" if share is not None else "")
            + f"; GPU-resident peak {shown(resident, '.2f', GIB)} GiB; "
            f"escaped {shown(number(point.get('escaped_bytes')), '.0f')} bytes")


def _row(point: Mapping[str, Any], work: Work, fastest: str | None) -> Row:
    step = number(point["step_ms"])
    return Row(
        key=point["point"], variant=point["variant"], label=label(point),
        checkpointing=bool(point["checkpointing"]),
        budget=None if number(point["gpu_budget"]) is None else int(point["gpu_budget"]),
        basis=point["step_basis"],
        each_ms=tuple(read_samples(point.get("samples")).get(BASES[point["step_basis"]]) or ()),
        step_ms=step, tokens_per_s=work.tokens / step * 1e3 if step else None,
        allocated=number(point["peak_allocated_bytes"]),
        reserved=number(point["peak_reserved_bytes"]),
        nvml=number(point["nvml_peak_bytes"]), held=number(point["held_peak_bytes"]),
        vs_zero=number(point[VS_ZERO]), vs_best=number(point[VS_BEST]), fastest_peer=fastest,
        fastest_peer_ms=number(point["fastest_peer_ms"]),
        vs_cuda=number(point[VS_CUDA]),
        loss_vs_cuda=number(point[LOSS_VS_CUDA]), loss_steps=number(point["loss_steps"]),
        accounting=accounting(point) if point["variant"] == "hpcmem" else None,
        host=number(point.get("host_peak_bytes")), scaling=number(point.get(SCALING)),
    )


def rows(points: pd.DataFrame) -> dict[Work, list[Row]]:
    """One row per point, grouped by work in the order first seen, in :data:`VARIANTS`' order
    and then the points' keys within each."""
    records = points.join(compared(points)).to_dict("records")
    labels = {point["point"]: label(point) for point in records}
    tables: dict[Work, list[Row]] = {work: [] for work in map(work_of, records)}
    for point in sorted(records, key=lambda p: (VARIANTS.index(p["variant"]), p["point"])):
        work = work_of(point)
        tables[work].append(_row(point, work, labels.get(point["fastest_peer"])))
    return tables


def work_of(point: Mapping[str, Any]) -> Work:
    """The work a point (or a point key's coordinates) trained."""
    gpus = number(point.get("world_size"))
    return Work(point["model"], point["dtype"], int(point["batch"]), int(point["seq_len"]),
                int(point["accumulate"]), int(gpus) if gpus else 1)


def step_time_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per work and point: the median and mean step, the step compared and its basis, the
    number of repeats, the ratios to ZeRO-Offload, to the fastest peer tool (with its point)
    and to ``cuda``, the loss's distance from ``cuda``'s, the GPU memory held, the host
    memory of the largest rank and the scaling from one GPU (``peers_step_time.csv``)."""
    columns = [*WORK, *SETTINGS, STEP, MEAN, "step_basis", "step_ms", "repeats", VS_ZERO,
               VS_BEST, "fastest_peer", VS_CUDA, LOSS_VS_CUDA, "held_peak_bytes",
               "peak_reserved_bytes", "host_peak_bytes", SCALING]
    table = points.join(compared(points).drop(columns="fastest_peer_ms"))
    return table[columns].sort_values(WORK, kind="stable").reset_index(drop=True)


def loss_shown(row: Row, missing: str | None = "—") -> str | None:
    """The row's loss distance from ``cuda``'s, with the steps compared."""
    steps = f" ({row.loss_steps:.0f})" if row.loss_steps is not None else ""
    return shown(row.loss_vs_cuda, ".3%", unit=steps, missing=missing)


def _ms(value: float | None) -> str:
    return shown(value, ".1f")


def _gib(value: float | None) -> str:
    return shown(value, ".2f", GIB)


#: what a work's step figure is, as its table's note says
_BASIS_NOTES = {
    "mean": "each run's mean step (total time over its timed steps)",
    "median": "each run's median step (these records time no mean)",
    "mixed": "each run's median step (some of these records time no mean, so every "
             "point is compared on the median)",
}


def _word(basis: str) -> str:
    """The statistic a basis reads: mean or median."""
    return BASES[basis].rpartition(".")[2]


def basis_note(table: Iterable[Row]) -> str:
    """What a work's step figure is, and which peer tool was fastest on it."""
    first, *_ = table
    note = f"Step: {_BASIS_NOTES[first.basis]}, the median over repeats"
    if first.fastest_peer is None:
        return note + "; no peer tool ran this work."
    return (note + f"; the fastest peer tool: {first.fastest_peer} "
            f"({_ms(first.fastest_peer_ms)} ms).")


def markdown(tables: Mapping[Work, Iterable[Row]]) -> str:
    """One table per work, its basis and fastest peer, then each hpcmem point's accounting."""
    lines: list[str] = []
    for work, table in tables.items():
        table = list(table)
        parallel = work.world_size > 1  # a rank's host memory and the scaling from one GPU
        lines += [f"## {work.title()}", "",
                  f"| variant | checkpointing | budget GiB | step ms, {_word(table[0].basis)} "
                  "(repeats) | tokens/s | GiB allocated / reserved | NVML GiB | held GiB | "
                  "vs fastest ZeRO-Offload | vs fastest peer | vs cuda | "
                  "last loss vs cuda (steps) |" + (" host GiB | vs 1 GPU |" if parallel else ""),
                  "|---" * (14 if parallel else 12) + "|"]
        for row in table:
            each = ", ".join(_ms(ms) for ms in row.each_ms)
            extra = (f" {_gib(row.host)} | {shown(row.scaling, '.0%')} |" if parallel else "")
            lines.append(
                f"| {row.label} | {row.checkpointing} | {_gib(row.budget)} | "
                f"**{_ms(row.step_ms)}** ({each}) | {shown(row.tokens_per_s, ',.0f')} | "
                f"{_gib(row.allocated)} / {_gib(row.reserved)} | {_gib(row.nvml)} | "
                f"{_gib(row.held)} | {shown(row.vs_zero, '.2f', unit='x')} | "
                f"{shown(row.vs_best, '.2f', unit='x')} | "
                f"{shown(row.vs_cuda, '.2f', unit='x')} | {loss_shown(row)} |" + extra)
        notes = [f"{row.label} at {_gib(row.budget)} GiB, {row.accounting}"
                 for row in table if row.accounting]
        lines += ["", basis_note(table), *(["", *notes] if notes else []), ""]
    return "\n".join(lines).rstrip("\n") + "\n"
