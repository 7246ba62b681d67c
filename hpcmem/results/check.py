"""Regression check: a summary's figures against references and the run history.

Each figure (``<point key>/<metric>``, see :mod:`hpcmem.results.references`) gets a
verdict: ``PASS`` when it was compared and lies inside its bands; ``NEW`` when there was
nothing to compare with; ``FAIL`` when it is a regression; ``NOISY`` when it lies outside a
band but that cannot be told from noise (listed, not a failure). Against the history (the
last N runs, once at least ``min_runs`` of them have the figure) a figure regresses only
when it lies outside the tolerance band around their median AND its repeats differ
significantly from theirs (Mann-Whitney U over the samples, :mod:`hpcmem.results.ranktest`,
when the numbers of samples allow a test at level ``alpha``), its own repeats agree (spread
at most ``max_spread``, or all of them outside the band), and the node state does not
explain it (shared cores now, none in the history, and slower; or the reverse, and faster;
unless every repeat lies outside the band: repeats run in rounds, so a busy neighbour shows
as spread, and a change in every repeat is a change).
Against a reference, a figure outside its bounds is ``NOISY`` when its point shared cores
or its repeats disagree (some of them inside the bounds), else ``FAIL``. Failed points and
invalid records of the summary are ``FAIL`` rows too: a benchmark that stopped producing
correct results is a regression. An exact reference key with no figure in the summary is
listed as ``MISSING`` (not a failure: sweeps change). :func:`conclude` then appends the
run to the history and writes the verdict, both or neither.

The system (``cluster:partition``) whose references and history apply is chosen per
point: the one asked for (``--system``, ``HPCMEM_SYSTEM``), else the Slurm partition the
point's records were measured in, else where the check itself runs. A run whose points
ran in two partitions is judged, and appended to the history, once per partition.

The verdict file (``hpcmem check --verdict-out``) is written by :func:`conclude` and
read back by :func:`read_verdict` (``hpcmem report --verdict``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.outputs import write_errors
from hpcmem.record.jsonl import atomic_open
from hpcmem.record.provenance import slurm_system, utc_now
from hpcmem.record.samples import NOISY_SPREAD, read_samples, spread
from hpcmem.record.spec import LOWER
from hpcmem.results.aggregate import Summary
from hpcmem.results.history import Baseline, Figure, History, RunInfo
from hpcmem.results.ranktest import mann_whitney_p, smallest_p
from hpcmem.results.references import References
from hpcmem.results.registry import BENCHMARKS, metric
from hpcmem.textfiles import TextFileError, read_text

__all__ = [
    "CheckError",
    "CheckResult",
    "Measured",
    "Row",
    "VerdictError",
    "check",
    "check_system",
    "conclude",
    "default_system",
    "evaluate",
    "format_table",
    "point_systems",
    "read_verdict",
    "requested_system",
    "summary_figures",
    "verdict_document",
]

_SYSTEM = re.compile(r"^[^:\s]+:[^:\s]+$")
#: the verdicts of a figure; only FAIL fails the run
VERDICTS = ("PASS", "FAIL", "NOISY", "NEW", "MISSING")


class CheckError(HpcmemError, ValueError):
    """A check setting that is not accepted; the message names the value."""


class VerdictError(HpcmemError, ValueError):
    """A file that is not a readable verdict of :func:`conclude`."""


@dataclass
class Row:
    """The verdict on one figure."""

    figure: str
    value: float | None
    unit: str
    reference: float | None
    lower_bound: float | None
    upper_bound: float | None
    history_median: float | None
    history_runs: int
    verdict: str
    note: str
    #: the system whose references and history the figure was judged against
    system: str = ""
    #: every repeat's value, their (max - min) / median, and the rank test's p-value
    samples: list[float] = field(default_factory=list)
    spread: float | None = None
    p_value: float | None = None
    #: whether the point shared cores with other work (None: not measured)
    shared_cores: bool | None = None


@dataclass(frozen=True)
class Measured:
    """One checked figure of the summary, with the system it is judged for."""

    name: str
    value: float
    unit: str
    system: str
    samples: tuple[float, ...]
    shared_cores: bool | None


@dataclass
class CheckResult:
    """All verdicts of one check, with the context they were made in."""

    rows: list[Row]
    system: str
    run_id: str
    history_folder: str | None
    history_last: int
    appended: bool
    #: the spread above which a point's repeats counted as too noisy to judge
    max_spread: float = NOISY_SPREAD

    @property
    def verdict(self) -> str:
        """``FAIL`` when any figure failed, else ``PASS``."""
        return "FAIL" if any(r.verdict == "FAIL" for r in self.rows) else "PASS"

    def counts(self) -> dict[str, int]:
        """How many rows got each verdict."""
        counts = dict.fromkeys(VERDICTS, 0)
        for row in self.rows:
            counts[row.verdict] += 1
        return counts


def check_system(system: str) -> str:
    """``system`` when it reads ``NAME:PARTITION``; CheckError otherwise."""
    if not _SYSTEM.fullmatch(system):
        raise CheckError(f"{system!r} is not NAME:PARTITION (e.g. mycluster:gpu)")
    return system


def requested_system(option: str | None) -> str | None:
    """The system asked for: ``--system`` (``option``), else ``HPCMEM_SYSTEM``, checked by
    :func:`check_system`; None when neither is set (then each point has its own)."""
    system = option or os.environ.get("HPCMEM_SYSTEM")
    return None if system is None else check_system(system)


def default_system() -> str:
    """Where this process runs: Slurm's ``cluster:partition``, else ``<host>:default``."""
    return slurm_system() or f"{os.uname().nodename.split('.')[0]}:default"


def point_systems(summary: Summary, system: str | None = None) -> dict[str, str]:
    """Per point key, the system whose references and history apply: ``system`` when
    given, else the one partition its records were measured in, else default_system()."""
    here = default_system()
    systems = {}
    for point in summary.points.to_dict("records"):
        recorded = str(point.get("systems") or "")
        systems[point["point"]] = system or (recorded if recorded and "," not in recorded
                                             else here)
    return systems


def _flag(value: Any) -> bool | None:
    """A summary's nullable boolean cell as True, False or None."""
    import pandas as pd

    return None if value is None or pd.isna(value) else bool(value)


def summary_figures(summary: Summary, references: References, systems: dict[str, str]
                    ) -> list[Measured]:
    """Every checked figure of the summary's points, with its samples and node state.

    Metrics their spec marks ``checked`` always are; the others only when a reference
    names them. A metric that does not apply to a point (bandwidth of a barrier) is none.
    """
    figures = []
    for point in summary.points.to_dict("records"):
        system = systems[point["point"]]
        samples = read_samples(point.get("samples"))
        shared = _flag(point.get("shared_cores"))
        for measured in BENCHMARKS[point["benchmark"]].metrics:
            value = point[measured.name]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if not measured.applies(point):
                continue
            name = f"{point['point']}/{measured.name}"
            if measured.checked or references.lookup(system, name) is not None:
                values = tuple(samples.get(measured.name) or [float(value)])
                figures.append(Measured(name, float(value), measured.unit, system, values,
                                        shared))
    return figures


def _outside(value: float, low: float | None, high: float | None) -> str | None:
    """``above`` or ``below`` the interval, or None inside it."""
    if low is not None and value < low:
        return "below"
    if high is not None and value > high:
        return "above"
    return None


def _describe(side: str, name: str, against: str) -> str:
    bound = f"({side} the {'upper' if side == 'above' else 'lower'} bound)"
    slow = _slower(side, name)
    if slow is None:
        return f"{'higher' if side == 'above' else 'lower'} than {against} {bound}"
    what = "slower than" if slow else "suspiciously faster than"
    return f"{what} {against} {bound}"


def _all_outside(samples: tuple[float, ...], low: float | None, high: float | None,
                 side: str) -> bool:
    """Whether every repeat lies on ``side`` of the interval: then no spread excuses it."""
    return all(_outside(value, low, high) == side for value in samples)


def _slower(side: str, name: str) -> bool | None:
    """Whether lying on ``side`` of a band means slower (None: the metric has no direction)."""
    better = metric(name).better
    return None if better is None else (side == "above") == (better == LOWER)


def _disturbance(side: str, name: str, figure: Measured, history: Baseline) -> str | None:
    """Why the node state explains the difference from the history, or None."""
    slower = _slower(side, name)
    if figure.shared_cores and history.shared_runs == 0 and slower is not False:
        return "the point shared cores with other work, the history's runs did not"
    if figure.shared_cores is False and history.shared_runs == history.runs and not slower:
        return "the history's runs shared cores with other work, this point did not"
    return None


def _against_history(figure: Measured, history: Baseline, references: References,
                     row: Row, noisy: str | None) -> tuple[str, str | None]:
    """The verdict against the history (PASS, NOISY or FAIL) and its note."""
    metric_name = figure.name.rsplit("/", 1)[1]
    tolerances = (references.history_lower, references.history_upper)
    low, high = (None if t is None else history.value * (1 + t) for t in tolerances)
    side = _outside(figure.value, low, high)
    if side is None:
        return "PASS", None
    change = (figure.value / history.value - 1) * 100 if history.value else math.inf
    what = f"{_describe(side, metric_name, 'the history')}: {change:+.0f}% vs median"
    m, n = len(figure.samples), len(history.samples)
    testable = smallest_p(m, n) <= references.history_alpha
    if testable:
        row.p_value = mann_whitney_p(figure.samples, history.samples)
        if row.p_value >= references.history_alpha:
            return "NOISY", (f"{what}, not significant (p={row.p_value:.2g}, {m} against "
                             f"{n} samples)")
    # repeats run in rounds: a busy neighbour shows as spread, while a change that every
    # repeat shows is a change, whatever the node state
    consistent = _all_outside(figure.samples, low, high, side)
    if noisy and not consistent:
        return "NOISY", f"{what}, {noisy}"
    if not consistent and (why := _disturbance(side, metric_name, figure, history)):
        return "NOISY", f"{what}, {why}"
    test = (f"p={row.p_value:.2g}, {m} against {n} samples" if testable
            else f"{m} against {n} samples: too few for a rank test")
    return "FAIL", f"{what} ({test})"


def _judge(figure: Measured, references: References, history: Baseline | None,
           min_runs: int) -> Row:
    row = Row(figure.name, figure.value, figure.unit, None, None, None, None, 0, "NEW", "",
              figure.system, samples=list(figure.samples), spread=spread(figure.samples),
              shared_cores=figure.shared_cores)
    if references.history_shared_cores == "judge":  # recorded, but no excuse
        figure = replace(figure, shared_cores=None)
    noisy = None
    if row.spread is not None and row.spread > references.history_max_spread:
        noisy = (f"its repeats spread {row.spread:.0%} of their median "
                 f"(max_spread {references.history_max_spread:.0%})")
    notes, outcomes = [], []
    reference = references.lookup(figure.system, figure.name)
    if reference is not None:
        row.reference = reference.target
        row.lower_bound, row.upper_bound = reference.bounds()
        side = _outside(figure.value, row.lower_bound, row.upper_bound)
        if side is None:
            outcomes.append("PASS")
        else:
            what = _describe(side, figure.name.rsplit("/", 1)[1], "the reference")
            low, high = row.lower_bound, row.upper_bound
            excuse = ("the point shared cores with other work" if figure.shared_cores
                      else None if _all_outside(figure.samples, low, high, side) else noisy)
            outcomes.append("NOISY" if excuse else "FAIL")
            notes.append(f"{what}, {excuse}" if excuse else what)
    if history is not None:
        row.history_median, row.history_runs = history.value, history.runs
        if history.runs < min_runs:
            notes.append(f"history of {history.runs} runs, fewer than min_runs {min_runs}: "
                         "not judged")
        else:
            outcome, note = _against_history(figure, history, references, row, noisy)
            outcomes.append(outcome)
            if note:
                notes.append(note)
    row.verdict = next((v for v in ("FAIL", "NOISY", "PASS") if v in outcomes), "NEW")
    row.note = "; ".join(notes)
    return row


def _problem_rows(summary: Summary) -> Iterable[Row]:
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
    """Every verdict row: figures, failed points, invalid records, missing references.

    ``systems`` maps point keys to systems (:func:`point_systems`), ``history`` systems
    to their figures' baselines. A figure is judged against its history only when the
    baseline is taken over at least ``min_runs`` runs (default: the references'
    ``history.min_runs``).
    """
    min_runs = min_runs or references.history_min_runs
    figures = summary_figures(summary, references, systems)
    rows = [_judge(f, references, history.get(f.system, {}).get(f.name), min_runs)
            for f in figures]
    rows.extend(_problem_rows(summary))
    seen = {f.name for f in figures}
    for system in sorted(set(systems.values())):
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

    ``system`` applies to every point; None chooses per point (:func:`point_systems`).
    ``last`` (default: the references' ``history.last``) must be a whole number >= 1.
    """
    if last is not None and last < 1:
        raise CheckError(f"{last} is not a whole number >= 1")
    run_id = "+".join(sorted(summary.metadata.get("run_ids") or [])) or "unknown"
    last = last or references.history_last
    systems = point_systems(summary, system)
    used = sorted(set(systems.values())) or [system or default_system()]
    store = History(history_folder) if history_folder is not None else None
    baselines = ({s: store.baselines(s, last, exclude_run=run_id) for s in used}
                 if store else {})
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
    :func:`format_table` prints it): all or none. The verdict is
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
                    _write_json(handles[verdict_out],
                                verdict_document(result, references_path))
            if table_out is not None:
                with write_errors(table_out):
                    _write_text(handles[table_out], format_table(result) + "\n")

        runs = []
        for name in sorted({r.system for r in result.rows if r.value is not None}):
            values = {r.figure: Figure(r.value, r.unit, tuple(r.samples), r.shared_cores)
                      for r in result.rows if r.value is not None and r.system == name}
            runs.append((_run_info(summary, name, result.run_id, result.verdict), values))
        if result.history_folder is not None and append and runs:
            History(result.history_folder).append_all(runs, then=write_verdict)
        else:
            write_verdict(False)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_table(result: CheckResult) -> str:
    """The verdict table as fixed-width text, with a closing summary line."""
    header = ("FIGURE", "VALUE", "SPREAD", "REFERENCE", "BOUNDS", "HISTORY", "P", "VERDICT",
              "NOTE")
    lines = []
    for r in result.rows:
        value = "-" if r.value is None else f"{r.value:.4g} {r.unit}"
        spread_text = "-" if r.spread is None else f"{r.spread:.0%}"
        bounds = "-" if r.reference is None else f"[{_fmt(r.lower_bound)}, {_fmt(r.upper_bound)}]"
        hist = "-" if r.history_median is None else f"{r.history_median:.4g} (n={r.history_runs})"
        p_value = "-" if r.p_value is None else f"{r.p_value:.2g}"
        lines.append((r.figure, value, spread_text, _fmt(r.reference), bounds, hist, p_value,
                      r.verdict, r.note))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header) - 1)]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        + "  " + row[-1]
        for row in [header, *lines]
    ]
    counts = result.counts()
    history = (f"history {result.history_folder} (last {result.history_last} runs"
               f"{', this run appended' if result.appended else ''})"
               if result.history_folder else "no history")
    text.append(
        f"# {result.verdict}: {counts['PASS']} pass, {counts['FAIL']} fail, "
        f"{counts['NOISY']} noisy, {counts['NEW']} new, {counts['MISSING']} missing; "
        f"system {result.system}, run {result.run_id}, {history}"
    )
    return "\n".join(line.rstrip() for line in text)


def _write_json(handle: Any, document: dict[str, Any]) -> None:
    """``document`` written and flushed to disk, so that a full disk shows here."""
    _write_text(handle, json.dumps(document, indent=1) + "\n")


def _write_text(handle: Any, text: str) -> None:
    """``text`` written and flushed to disk, so that a full disk shows here."""
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())


def verdict_document(result: CheckResult, references_path: str) -> dict[str, Any]:
    """The verdict file's content, for ``hpcmem report --verdict`` and the summary lines."""
    return {
        "verdict": result.verdict,
        "system": result.system,
        "run_id": result.run_id,
        "checked_at": utc_now(),
        "references": references_path,
        "history": {"folder": result.history_folder, "last": result.history_last,
                    "appended": result.appended},
        "max_spread": result.max_spread,
        "counts": result.counts(),
        "figures": [asdict(row) for row in result.rows],
    }


def read_verdict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The verdict :func:`conclude` wrote; VerdictError names what is wrong with it."""
    try:
        verdict = json.loads(read_text(path))
    except TextFileError as error:
        raise VerdictError(str(error)) from None
    except json.JSONDecodeError as error:
        raise VerdictError(f"{path}:{error.lineno}: not JSON ({error.msg})") from None
    if not isinstance(verdict, dict) or "verdict" not in verdict or "figures" not in verdict:
        raise VerdictError(f"{path}: not an `hpcmem check --verdict-out` file")
    return verdict
