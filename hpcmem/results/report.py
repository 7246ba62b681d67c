"""The HTML report: one self-contained page with matplotlib plots embedded as PNG.

Sections: the check verdict (when given), one section per benchmark of the registry
(its ``Reporting.section``: collectives latency, bandwidth and speedup over NumPy buffers;
training step time per Unified Memory policy; the peers, each tool's step time against the
GPU memory it held, only where the summary holds them) drawn from the points measured on
real nodes,
the points measured in virtual machines apart (:mod:`hpcmem.results.virtual`), native
against container (when given the same points run natively), sections drawn by the caller
(``hpcmem report --osu``: OSU C against hpcmem), the failed, skipped and invalid records
with their reasons, and the machine and run metadata, with the run's Slurm jobs when the
caller draws them (``hpcmem report --slurm-jobs``), else the job ids its records name.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcmem import __version__
from hpcmem.draw.html import PAGE, badge, section, table
from hpcmem.outputs import write_errors
from hpcmem.record.jsonl import atomic_open
from hpcmem.record.provenance import slurm_job_order, utc_now
from hpcmem.results.native_comparison import container_section
from hpcmem.results.registry import REPORTS
from hpcmem.results.summary import Summary, benchmark_points
from hpcmem.results.verdict import CONCLUSIVE, headline
from hpcmem.results.virtual import split, vm_section

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["render_report", "write_report"]

def _run_badge(verdict: dict[str, Any]) -> str:
    """The run's verdict badge; a grey NEW BASELINE for a pass that judged no figure."""
    counts = verdict.get("counts", {})
    if verdict.get("verdict") == "PASS" and not any(counts.get(v) for v in CONCLUSIVE):
        return badge("NEW", "NEW BASELINE")
    return badge(verdict.get("verdict"))


def _verdict_section(verdict: dict[str, Any]) -> str:
    rows = verdict.get("figures", [])
    summary = headline(verdict.get("counts", {}), rows)
    top = (f'<p class="headline">{_run_badge(verdict)} {html.escape(summary)} — system '
           f'<code>{html.escape(str(verdict.get("system")))}</code>, checked '
           f'{html.escape(str(verdict.get("checked_at")))}.</p>')

    def shaped(items: list[dict[str, Any]]) -> list[list[Any]]:
        return [[r["figure"], r["value"], r["unit"], r.get("spread"), r["reference"],
                 r["lower_bound"], r["upper_bound"], r["history_median"], r.get("p_value"),
                 badge(r["verdict"]), html.escape(r["note"])] for r in items]

    headers = ["figure", "value", "unit", "spread", "reference", "lower bound", "upper bound",
               "history median", "p", "verdict", "note"]
    kinds = ["key", "num", "text", "num", "num", "num", "num", "num", "num", "raw", "raw"]
    notable = [r for r in rows if r["verdict"] in ("FAIL", "NOISY", "MISSING", "UNJUDGED")]
    parts = [top]
    if notable:
        parts.append("<h3>Failures, noisy, missing and unjudged figures</h3>")
        parts.append('<p class="note">NOISY: outside a band, but not told apart from noise '
                     '(repeats too spread, not significant, or the node shared its cores); '
                     'listed, not a failure. UNJUDGED: no usable value (NaN, missing or not '
                     'a number): nothing to judge. A run with no figure judged fails, unless '
                     'the check was run with --allow-unjudged.</p>')
        parts.append(table(headers, shaped(notable), kinds))
    parts.append(f"<details><summary>All {len(rows)} checked figures</summary>"
                 f"{table(headers, shaped(rows), kinds)}</details>")
    return section("Regression check", *parts, anchor="verdict")


def _left_out(summary: Summary, benchmark: str) -> pd.DataFrame:
    """The failed and skipped records of ``benchmark`` (none where nothing was left out)."""
    skipped = summary.skipped
    return benchmark_points(skipped, benchmark) if len(skipped) else skipped


def _left_out_note(summary: Summary, benchmark: str) -> str:
    """A pointer to the failed and skipped points of ``benchmark``, when it has any."""
    count = len(_left_out(summary, benchmark))
    if not count:
        return ""
    return (f'<p class="note">{count} {benchmark} point{"s" if count > 1 else ""} failed or '
            'skipped: see <a href="#problems">Failed, skipped and invalid records</a>.</p>')


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


def _metadata_section(summary: Summary, jobs: str | None) -> str:
    """The machine and run; ``jobs``: the run's Slurm jobs drawn as HTML, else the job ids
    of the records, sorted."""
    meta = summary.metadata
    counts = meta.get("records", {})

    def joined(name: str) -> str:
        values = meta.get(name) or []
        return ", ".join(map(str, values)) if values else "-"

    job_ids = sorted(map(str, meta.get("slurm_job_ids") or []), key=slurm_job_order)

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
        ("Slurm jobs", "listed below" if jobs is not None else ", ".join(job_ids) or "-"),
        ("records", ", ".join(f"{counts.get(k, 0)} {k}"
                              for k in ("ok", "failed", "skipped", "rejected"))),
        ("time span", f"{meta.get('first_timestamp')} to {meta.get('last_timestamp')}"),
        ("aggregated", str(meta.get("aggregated_at"))),
    ]
    body = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return section("Machine and run", f'<dl class="meta">{body}</dl>', *filter(None, [jobs]),
                   anchor="metadata")


def render_report(summary: Summary, verdict: dict[str, Any] | None = None,
                  native: Summary | None = None, extra: Sequence[str] = (),
                  jobs: str | None = None) -> str:
    """The whole report page as HTML text; ``native``: the same points run natively, for
    the native-against-container section; ``extra``: sections drawn elsewhere (the CLI's
    OSU comparison), placed before the records left out; ``jobs``: the run's Slurm jobs
    drawn elsewhere (the CLI's sacct table), placed in the run section."""
    import matplotlib

    matplotlib.use("Agg")
    points = summary.points
    real, virtual = split(points)
    parts = []
    if verdict is not None:
        parts.append(_verdict_section(verdict))
    for name, reporting in REPORTS.items():
        ours, left_out = benchmark_points(real, name), _left_out_note(summary, name)
        if reporting.optional and ours.empty and not left_out:
            continue
        drawn = [reporting.section(ours)]
        if reporting.left_out_section is not None:
            drawn.append(reporting.left_out_section(ours, _left_out(summary, name)))
        parts.append(section(reporting.title, "\n".join(drawn) + left_out, anchor=name))
    if len(virtual):
        parts.append(vm_section(virtual))
    if native is not None:
        parts.append(container_section(summary, native))
    parts.extend(extra)
    parts.append(_problems_section(summary))
    parts.append(_metadata_section(summary, jobs))
    run_ids = summary.metadata.get("run_ids") or []
    runs = ", ".join(run_ids) or "no valid records"
    if len(run_ids) > 3:  # all of them under "Machine and run"
        runs = f"{run_ids[0]} … {run_ids[-1]} ({len(run_ids)} runs)"
    judged = (f" · {headline(verdict.get('counts', {}), verdict.get('figures', []))}"
              if verdict else "")
    return PAGE.substitute(
        version=html.escape(__version__),
        title="hpcmem report",
        badge=_run_badge(verdict) if verdict else "",
        subtitle=html.escape(f"run {runs} · {len(points)} points{judged} · generated "
                             f"{utc_now()}"),
        body="\n".join(parts),
    )


def write_report(path: str | os.PathLike[str], summary: Summary,
                 verdict: dict[str, Any] | None = None, native: Summary | None = None,
                 extra: Sequence[str] = (), jobs: str | None = None) -> None:
    """Render and write the report atomically; OutputPathError when it cannot be written."""
    page = render_report(summary, verdict, native, extra, jobs)
    with write_errors(path), atomic_open(path) as handle:
        handle.write(page)
