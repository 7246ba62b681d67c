"""The HTML report: one self-contained page with matplotlib plots embedded as PNG.

Sections: the check verdict (when given), collectives latency and bus bandwidth
against message size per op and buffer kind (log-log), the speedup of each
buffer kind over NumPy buffers per size, training step time per Unified Memory
policy with its p10-p90 spread, the failed, skipped and invalid records with
their reasons, and the machine and run metadata.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpcmem import __version__
from hpcmem.results.aggregate import Summary, latency_table, speedup_table, step_time_table
from hpcmem.results.records import atomic_open, utc_now
from hpcmem.results.report_template import PAGE, badge, section, table
from hpcmem.units import format_count, format_size

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["render_report", "write_report"]

_DPI = 100
_COLORS = {"numpy": "#4c72b0", "hbw": "#dd8452", "hbw_preferred": "#55a868",
           "hbw_interleave": "#c44e52", "mpi_alloc": "#8172b3", "dram": "#937860",
           "dax_kmem": "#da8bc3"}
#: line style and marker per binding, so buffer kinds keep their colour across bindings
_BINDING_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
_POLICY_COLORS = {"cuda": "#4c72b0", "um": "#c44e52", "hpcmem": "#55a868"}


def _new_figure(width: float, height: float, columns: int = 1, rows: int = 1
                ) -> tuple[Figure, Any]:
    """A constrained-layout figure and its axes, flattened row by row."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False).ravel()


def _embed(figure: Figure, alt: str, caption: str) -> str:
    """The figure as an ``<img>`` with a base64 PNG data URI, inside a ``<figure>``."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI)
    width, height = (round(v * _DPI) for v in figure.get_size_inches())
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'alt="{html.escape(alt)}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def _log_size_axis(axes: Any, sizes: Any) -> None:
    """A log2 x axis labelled in bytes, at most about ten ticks over the sizes plotted."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = (int(math.log2(v)) for v in (min(sizes), max(sizes)))
    step = max(1, math.ceil((high - low + 1) / 10))
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(low, high + 1, step)]))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_formatter(FuncFormatter(lambda size, _pos: format_size(size)))
    axes.set_xlabel("message size (bytes)")
    axes.grid(True, which="major", alpha=0.3)


def _plain(value: float, _pos: Any = None) -> str:
    return f"{value:g}"


def _log_value_axis(axes: Any) -> None:
    """A log y axis with plain numbers, labelling minor ticks when it spans few decades."""
    from matplotlib.ticker import FuncFormatter

    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(_plain))
    low, high = axes.get_ylim()
    decades = math.log10(high / low)
    labelled = (2, 3, 4, 5, 6, 7, 8, 9) if decades < 1 else (2, 5) if decades < 3.5 else ()
    if labelled:
        def minor(value: float, _pos: Any = None) -> str:
            digit = round(value / 10 ** math.floor(math.log10(value)))
            return f"{value:g}" if digit in labelled else ""

        axes.yaxis.set_minor_formatter(FuncFormatter(minor))
        axes.grid(True, which="minor", axis="y", alpha=0.15)
    axes.grid(True, which="major", axis="y", alpha=0.3)


def _series_label(buffer: str, binding: str, bindings: int) -> str:
    return buffer if bindings == 1 else f"{buffer} · {binding}"


def collectives_figures(points: pd.DataFrame) -> Iterator[str]:
    """Per op and rank count: latency and bus bandwidth against size, one line per buffer."""
    coll = points[(points["benchmark"] == "collectives") & (points["size_bytes"] > 0)]
    for (op, dtype, ranks), group in coll.groupby(["op", "dtype", "ranks"], sort=True,
                                                    dropna=False):
        figure, (lat, bw) = _new_figure(11, 3.9, columns=2)
        bindings = sorted(group["binding"].unique())
        for (buffer, binding), line in group.groupby(["buffer", "binding"], sort=True):
            line = line.sort_values("size_bytes")
            index = bindings.index(binding) % len(_BINDING_STYLES)
            linestyle, marker = _BINDING_STYLES[index]
            style = {"color": _COLORS.get(buffer), "marker": marker, "markersize": 3.5,
                     "linestyle": linestyle, "linewidth": 1.6,
                     "label": _series_label(buffer, binding, len(bindings))}
            lat.plot(line["size_bytes"], line["latency_us_avg"], **style)
            bw.plot(line["size_bytes"], line["busbw_GBps"], **style)
        for axes in (lat, bw):
            _log_size_axis(axes, group["size_bytes"])
            _log_value_axis(axes)
        lat.set_ylabel("average latency (µs)")
        lat.set_title(f"{op} ({dtype}): latency, {ranks} ranks", fontsize=11)
        bw.set_ylabel("bus bandwidth (GB/s)")
        bw.set_title(f"{op} ({dtype}): bus bandwidth, {ranks} ranks", fontsize=11)
        title = "buffer" if len(bindings) == 1 else "buffer · binding"
        lat.legend(title=title, fontsize=9, title_fontsize=9)
        yield _embed(
            figure,
            f"{op} latency and bus bandwidth against message size, {ranks} ranks",
            f"{op}, {ranks} ranks: median over repeats of the average latency across ranks (µs) "
            "and bus bandwidth (GB/s, nccl-tests convention), log-log.",
        )


def speedup_figure(points: pd.DataFrame) -> str | None:
    """Each buffer kind's speedup over NumPy buffers against size, one line per op."""
    speed = speedup_table(points)
    speed = speed[speed["size_bytes"] > 0]
    if speed.empty:
        return None
    figure, (axes,) = _new_figure(11, 3.9)
    bindings, dtypes = speed["binding"].nunique(), speed["dtype"].nunique(dropna=False)
    for (op, dtype, ranks, binding, buffer), line in speed.groupby(
        ["op", "dtype", "ranks", "binding", "buffer"], sort=True, dropna=False
    ):
        line = line.sort_values("size_bytes")
        label = f"{op} · {buffer} · {ranks} ranks" + (f" · {binding}" if bindings > 1 else "")
        label += f" · {dtype}" if dtypes > 1 else ""
        axes.plot(line["size_bytes"], line["speedup"], marker="o", markersize=3.5,
                  linewidth=1.6, label=label)
    axes.axhline(1.0, color="#555", linewidth=1, linestyle="--")
    _log_size_axis(axes, speed["size_bytes"])
    if speed["speedup"].max() / speed["speedup"].min() > 4:
        _log_value_axis(axes)  # symmetric for gains and losses; linear when the range is small
    axes.set_ylabel("speedup over numpy buffers (\u00d7)")
    axes.set_title("latency of numpy buffers / latency of the buffer kind", fontsize=11)
    axes.legend(fontsize=9, ncols=2)
    return _embed(figure, "speedup of each buffer kind over numpy buffers by message size",
                  "Above 1: the buffer kind is faster than plain NumPy buffers at that size "
                  "(ratio of median average latencies, dimensionless).")


def training_figure(points: pd.DataFrame) -> str | None:
    """Median step time per policy with the p10-p90 spread, one panel per model point."""
    import pandas as pd

    steps = step_time_table(points)
    if steps.empty:
        return None
    keys = ["model", "params", "batch", "seq_len", "dtype", "gpu_budget"]
    groups = list(steps.groupby(keys, sort=True, dropna=False))
    columns = min(len(groups), 3)
    rows = math.ceil(len(groups) / columns)
    figure, panels = _new_figure(4.2 * columns, 3.9 * rows, columns=columns, rows=rows)
    for axes in panels[len(groups):]:
        axes.set_visible(False)
    for axes, (key, group) in zip(panels, groups, strict=False):
        model, params, batch, _seq_len, dtype, budget = key
        policies = list(group["policy"])
        median = group["step_ms_median"].to_numpy(dtype=float)
        spread = [median - group["step_ms_p10"].to_numpy(dtype=float),
                  group["step_ms_p90"].to_numpy(dtype=float) - median]
        colors = [_POLICY_COLORS.get(p, "#8172b3") for p in policies]
        axes.bar(policies, median, yerr=spread, capsize=5, color=colors, width=0.6,
                 error_kw={"elinewidth": 1, "ecolor": "#333"})
        tops = group["step_ms_p90"].to_numpy(dtype=float)
        for x, (value, top, ratio) in enumerate(
            zip(median, tops, group["ratio_to_um"], strict=True)
        ):
            text = f"{value:.1f} ms" + ("" if pd.isna(ratio) else f"\n{ratio:.2f}\u00d7 um")
            axes.annotate(text, (x, top), textcoords="offset points", xytext=(0, 4),
                          ha="center", va="bottom", fontsize=8)
        axes.margins(y=0.2)
        title = f"{model}, {format_count(params)} params, batch {batch}, {dtype}"
        if not pd.isna(budget):
            title += f", budget {format_size(float(budget))}"
        axes.set_title(title, fontsize=10)
        axes.set_ylabel("step time (ms)")
        axes.set_xlabel("memory policy")
        axes.grid(True, axis="y", alpha=0.3)
    return _embed(figure, "training step time per memory policy",
                  "Median step time (ms) per policy, with its ratio to the um policy (UM "
                  "without advice); whiskers span p10-p90 of step times (medians over repeats).")


def _numbers(frame: pd.DataFrame, title: str) -> str:
    """A folded table of a summary's numbers."""
    import pandas as pd

    kinds = ["num" if frame[c].dtype.kind in "fiu" else "text" for c in frame.columns]
    rows = [[None if pd.isna(v) else v for v in row]
            for row in frame.astype(object).itertuples(index=False)]
    body = table(list(frame.columns), rows, kinds)
    return f"<details><summary>{html.escape(title)}</summary>{body}</details>"


def _verdict_section(verdict: dict[str, Any]) -> str:
    rows = verdict.get("figures", [])
    counts = verdict.get("counts", {})
    summary = ", ".join(f"{n} {k.lower()}" for k, n in counts.items())
    headline = (f'<p>{badge(verdict.get("verdict"))} {html.escape(summary)} — system '
                f'<code>{html.escape(str(verdict.get("system")))}</code>, checked '
                f'{html.escape(str(verdict.get("checked_at")))}.</p>')

    def shaped(items: list[dict[str, Any]]) -> list[list[Any]]:
        return [[r["figure"], r["value"], r["unit"], r["reference"], r["lower_bound"],
                 r["upper_bound"], r["history_median"], badge(r["verdict"]),
                 html.escape(r["note"])] for r in items]

    headers = ["figure", "value", "unit", "reference", "lower bound", "upper bound",
               "history median", "verdict", "note"]
    kinds = ["key", "num", "text", "num", "num", "num", "num", "raw", "raw"]
    notable = [r for r in rows if r["verdict"] in ("FAIL", "MISSING")]
    parts = [headline]
    if notable:
        parts.append("<h3>Failures and missing figures</h3>")
        parts.append(table(headers, shaped(notable), kinds))
    parts.append(f"<details><summary>All {len(rows)} checked figures</summary>"
                 f"{table(headers, shaped(rows), kinds)}</details>")
    return section("Regression check", *parts, anchor="verdict")


def _problems_section(summary: Summary) -> str:
    skipped = summary.skipped.to_dict("records")
    rejected = summary.rejected.to_dict("records")
    if not skipped and not rejected:
        return section("Failed, skipped and invalid records",
                       '<p class="note">None: every record was valid and ran.</p>')
    parts = []
    if skipped:
        files = [str(s["file"]) for s in skipped]
        root = os.path.commonpath(files) if len(set(files)) > 1 else os.path.dirname(files[0])
        parts.append("<h3>Failed and skipped points (not averaged in)</h3>")
        parts.append(f'<p class="note">Records under <code>{html.escape(root)}</code>.</p>')
        parts.append(table(
            ["status", "point", "reason", "run", "host", "record"],
            [[s["status"], s["point"], s["reason"], s["run_id"], s["host"],
              f"{os.path.relpath(str(s['file']), root)}:{s['line']}"] for s in skipped],
            ["text", "key", "text", "text", "text", "key"],
        ))
    if rejected:
        parts.append("<h3>Invalid records (rejected by the schema or not JSON)</h3>")
        parts.append(table(["record", "error"],
                           [[f"{r['file']}:{r['line']}", r["error"]] for r in rejected],
                           ["key", "text"]))
    return section("Failed, skipped and invalid records", *parts, anchor="problems")


def _metadata_section(summary: Summary) -> str:
    meta = summary.metadata
    counts = meta.get("records", {})

    def joined(name: str) -> str:
        values = meta.get(name) or []
        return ", ".join(map(str, values)) if values else "-"

    containers = meta.get("containers") or []
    items = [
        ("runs", joined("run_ids")),
        ("hosts", joined("hosts")),
        ("git commit", joined("git_shas")),
        ("hpcmem", joined("hpcmem_versions")),
        ("MPI library", joined("mpi_libraries")),
        ("HBW memory", "emulated (MEMKIND_HBW_NODES)" if meta.get("hbw_emulated")
         else "detected, or not used"),
        ("GPU", joined("gpus")),
        ("torch / CUDA", f"{joined('torch')} / {joined('cuda')}"),
        ("container", ", ".join(f"{c.get('image')} {c.get('digest')}" for c in containers)
         if containers else "none (ran natively)"),
        ("Slurm jobs", joined("slurm_job_ids")),
        ("records", ", ".join(f"{counts.get(k, 0)} {k}"
                              for k in ("ok", "failed", "skipped", "rejected"))),
        ("time span", f"{meta.get('first_timestamp')} to {meta.get('last_timestamp')}"),
        ("aggregated", str(meta.get("aggregated_at"))),
    ]
    body = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return section("Machine and run", f'<dl class="meta">{body}</dl>', anchor="metadata")


def render_report(summary: Summary, verdict: dict[str, Any] | None = None) -> str:
    """The whole report page as HTML text."""
    import matplotlib

    matplotlib.use("Agg")
    points = summary.points
    parts = []
    if verdict is not None:
        parts.append(_verdict_section(verdict))
    coll = list(collectives_figures(points))
    speed = speedup_figure(points)
    parts.append(section(
        "Collectives",
        *(coll or ['<p class="note">No collectives points in this summary.</p>']),
        *(["<h3>Speedup over NumPy buffers</h3>", speed] if speed else []),
        *([_numbers(latency_table(points), "Latency table (µs, median over repeats)")]
          if coll else []),
        anchor="collectives",
    ))
    train = training_figure(points)
    parts.append(section(
        "Training with Unified Memory",
        train or '<p class="note">No training points in this summary '
                 "(see the skipped points below for why).</p>",
        *([_numbers(step_time_table(points), "Step time table (ms, median over repeats)")]
          if train else []),
        anchor="training",
    ))
    parts.append(_problems_section(summary))
    parts.append(_metadata_section(summary))
    runs = ", ".join(summary.metadata.get("run_ids") or []) or "no valid records"
    return PAGE.substitute(
        version=html.escape(__version__),
        title="hpcmem report",
        badge=badge(verdict.get("verdict")) if verdict else "",
        subtitle=html.escape(f"run {runs} · {len(points)} points · generated {utc_now()}"),
        body="\n".join(parts),
    )


def write_report(path: str | os.PathLike[str], summary: Summary,
                 verdict: dict[str, Any] | None = None) -> None:
    """Render and write the report atomically."""
    page = render_report(summary, verdict)
    with atomic_open(path) as handle:
        handle.write(page)
