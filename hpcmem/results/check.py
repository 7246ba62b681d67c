"""Regression check: a summary's figures against references and the run history.

:func:`check` takes every checked figure of a summary (``<point key>/<metric>``, see
:mod:`hpcmem.results.references`), finds the system each point is judged for
(:mod:`hpcmem.results.systems`) and that system's history, and judges the figure
(:mod:`hpcmem.results.judge`): ``PASS``, ``FAIL``, ``NOISY`` or ``NEW``. A checked figure
whose value is missing, NaN or not a number is ``UNJUDGED`` (an optional metric without a
value is simply not measured there). Failed points and invalid records of the summary are
``FAIL`` rows too: a benchmark that stopped producing correct results is a regression. An
exact reference key with no figure in the summary is listed as ``MISSING`` (not a failure:
sweeps change). A point measured in a virtual machine is judged against nothing: each of its
checked figures is ``UNJUDGED``, saying so (:mod:`hpcmem.results.virtual`).
:func:`conclude` then appends the run to the history and writes the verdict file
(:mod:`hpcmem.results.verdict`), both or neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hpcmem.errors import clip
from hpcmem.outputs import write_errors
from hpcmem.record.jsonl import atomic_open
from hpcmem.record.provenance import utc_now
from hpcmem.record.samples import finite_number, read_samples
from hpcmem.results.history import MAX_LAST, Baseline, Figure, History, RunInfo
from hpcmem.results.judge import Measured, judge
from hpcmem.results.references import Reference, References
from hpcmem.results.registry import BENCHMARKS
from hpcmem.results.summary import Summary
from hpcmem.results.summary import run_id as summary_run_id
from hpcmem.results.systems import default_system, point_systems
from hpcmem.results.verdict import CheckError, CheckResult, Row, write_document, write_table
from hpcmem.results.virtual import NOTE as VM_NOTE
from hpcmem.results.virtual import is_vm_system, point_vm

__all__ = ["check", "conclude", "evaluate", "summary_figures"]


def _flag(value: Any) -> bool | None:
    """A summary's nullable boolean cell as True, False or None."""
    import pandas as pd

    return None if value is None or pd.isna(value) else bool(value)


#: the note of a checked figure without a value
_NO_VALUE = "no value (NaN or missing): nothing to judge"


def _unusable(value: Any) -> str | None:
    """Why a summary cell is not a figure's value (the UNJUDGED note), or None when it is."""
    import pandas as pd

    if finite_number(value):
        return None
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return _NO_VALUE
    return f"value {clip(repr(value), 60)} is not a finite number: nothing to judge"


def _unjudged(name: str, unit: str, system: str, reference: Reference | None, note: str
              ) -> Row:
    """The UNJUDGED row of a checked figure without a usable value."""
    row = Row(name, None, unit, None, None, None, None, 0, "UNJUDGED", note, system)
    if reference is not None:
        row.reference = reference.target
        row.lower_bound, row.upper_bound = reference.bounds()
    return row


def summary_figures(summary: Summary, references: References, systems: dict[str, str]
                    ) -> tuple[list[Measured], list[Row]]:
    """Every checked figure of the summary's points, with its samples and node state, and
    the UNJUDGED rows of those without a usable value.

    Metrics their spec marks ``checked`` always are; the others only when a reference
    names them. A metric that does not apply to a point (bandwidth of a barrier), or an
    optional one the point lacks, is none. A VM point's checked figures are all UNJUDGED,
    whatever their value: no reference names them.
    """
    figures, unjudged = [], []
    for point in summary.points.to_dict("records"):
        system = systems[point["point"]]
        samples = read_samples(point.get("samples"))
        shared = _flag(point.get("shared_cores"))
        for measured in BENCHMARKS[point["benchmark"]].metrics:
            if not measured.applies(point):
                continue
            name = f"{point['point']}/{measured.name}"
            if vm := point_vm(point):
                if measured.checked:
                    unjudged.append(_unjudged(name, measured.unit, system, None,
                                              VM_NOTE.format(name=vm)))
                continue
            if not (measured.checked or references.lookup(system, name) is not None):
                continue
            value = point[measured.name]
            if (note := _unusable(value)) is None:
                values = tuple(samples.get(measured.name) or [float(value)])
                figures.append(Measured(name, float(value), measured.unit, system, values,
                                        shared))
            elif measured.required or note != _NO_VALUE:  # an optional one: not measured
                unjudged.append(_unjudged(name, measured.unit, system,
                                          references.lookup(system, name), note))
    return figures, unjudged


def _problem_rows(summary: Summary) -> Iterable[Row]:
    """A FAIL row for every failed point and every invalid record of ``summary``."""
    for item in summary.skipped.to_dict("records"):
        if item["status"] == "failed":
            yield Row(f"{item['point']}/status", None, "", None, None, None, None, 0, "FAIL",
                      f"point failed: {item['reason']}")
    for item in summary.rejected.to_dict("records"):
        yield Row(f"record {item['file']}:{item['line']}", None, "", None, None, None, None, 0,
                  "FAIL", f"invalid record: {item['error']}")


def evaluate(summary: Summary, references: References, systems: dict[str, str],
             history: dict[str, dict[str, Baseline]], min_runs: int | None = None
             ) -> list[Row]:
    """Every verdict row: figures, unjudged figures, failed points, invalid records, missing
    references.

    ``systems`` maps point keys to systems
    (:func:`~hpcmem.results.systems.point_systems`), ``history`` systems to their figures'
    baselines. A figure is judged against its history only when the
    baseline is taken over at least ``min_runs`` runs (default: the references'
    ``history.min_runs``).
    """
    min_runs = min_runs or references.history_min_runs
    figures, unjudged = summary_figures(summary, references, systems)
    rows = [judge(f, references, history.get(f.system, {}).get(f.name), min_runs)
            for f in figures]
    rows.extend(unjudged)
    rows.extend(_problem_rows(summary))
    seen = {f.name for f in figures} | {row.figure for row in unjudged}
    for system in sorted(s for s in set(systems.values()) if not is_vm_system(s)):
        for key in references.exact_keys(system):
            if key not in seen:
                ref = references.lookup(system, key)
                assert ref is not None
                seen.add(key)
                rows.append(Row(key, None, ref.unit, ref.target, *ref.bounds(), None, 0,
                                "MISSING",
                                "a reference names it but the summary has no such figure",
                                system))
    return rows


def _run_info(summary: Summary, system: str, run_id: str, verdict: str) -> RunInfo:
    meta = summary.metadata
    return RunInfo(
        run_id=run_id,
        system=system,
        timestamp=meta.get("last_timestamp"),
        checked_at=utc_now(),
        git_sha=",".join(meta.get("git_shas") or []) or None,
        hosts=list(meta.get("hosts") or []),
        hpcmem_version=",".join(meta.get("hpcmem_versions") or []) or None,
        container=(meta.get("containers") or [None])[0],
        slurm_job_ids=[str(j) for j in meta.get("slurm_job_ids") or []],
        verdict=verdict,
    )


def check(summary: Summary, references: References, system: str | None = None, *,
          history_folder: str | os.PathLike[str] | None = None, last: int | None = None
          ) -> CheckResult:
    """Check ``summary`` against the references and, with a history folder, the last runs
    there; nothing is written (:func:`conclude` records the result).

    ``system`` applies to every point; None chooses per point
    (:func:`~hpcmem.results.systems.point_systems`).
    ``last`` (default: the references' ``history.last``) must be a whole number from 1 to
    :data:`~hpcmem.results.history.MAX_LAST`.
    """
    if last is not None and not 1 <= last <= MAX_LAST:
        raise CheckError(f"{last} is not a whole number from 1 to {MAX_LAST}")
    run_id = summary_run_id(summary)
    last = last or references.history_last
    systems = point_systems(summary, system)
    used = sorted(set(systems.values())) or [system or default_system()]
    store = History(history_folder) if history_folder is not None else None
    baselines = ({s: store.baselines(s, last, exclude_run=run_id) for s in used
                  if not is_vm_system(s)} if store else {})
    # asking for fewer runs than min_runs (--last 1) means: judge on what was asked for
    rows = evaluate(summary, references, systems, baselines,
                    min_runs=min(references.history_min_runs, last))
    return CheckResult(rows, ",".join(used), run_id,
                       str(history_folder) if store else None, last, appended=False,
                       max_spread=references.history_max_spread)


def conclude(result: CheckResult, summary: Summary, *, append: bool,
             verdict_out: str | os.PathLike[str] | None, references_path: str,
             table_out: str | os.PathLike[str] | None = None) -> None:
    """Append the run to the history, once per system its points ran in (when ``append``
    and the check had one), and write the verdict file (and the table, ``table_out``, as
    :func:`~hpcmem.results.verdict.format_table` prints it): all or none. The verdict is
    written in full under a temporary name inside the history's transaction, the
    transaction committed, and only then the verdict renamed into place: a failure to
    write the verdict appends nothing, a failure to append leaves no verdict.

    Raises :class:`hpcmem.outputs.OutputPathError` for the verdict and ``sqlite3.Error`` or
    ``OSError`` for the history store.
    """
    with ExitStack() as stack:
        handles = {}
        for path in (verdict_out, table_out):
            if path is not None:
                stack.enter_context(write_errors(path))
                handles[path] = stack.enter_context(atomic_open(Path(path)))

        def write_verdict(appended: bool) -> None:
            result.appended = appended
            # an OSError here must not pass for the history's
            if verdict_out is not None:
                with write_errors(verdict_out):
                    write_document(handles[verdict_out], result, references_path)
            if table_out is not None:
                with write_errors(table_out):
                    write_table(handles[table_out], result)

        runs = []
        for name in sorted({r.system for r in result.rows if r.value is not None}):
            values = {r.figure: Figure(r.value, r.unit, tuple(r.samples), r.shared_cores,
                                       r.verdict)
                      for r in result.rows if r.value is not None and r.system == name}
            runs.append((_run_info(summary, name, result.run_id, result.verdict), values))
        if result.history_folder is not None and append and runs:
            History(result.history_folder).append_all(runs, then=write_verdict)
        else:
            write_verdict(False)
