"""Judging one figure against its reference and its history: PASS, FAIL, NOISY or NEW.

Against the history (the last N runs, once at least ``min_runs`` of them have the figure) a
figure regresses only when it lies outside the tolerance band around their median AND its
repeats differ significantly from theirs (Mann-Whitney U over the samples,
:mod:`hpcmem.results.ranktest`, when the numbers of samples allow a test at level
``alpha``), its own repeats agree (spread at most ``max_spread``, or all of them outside the
band), and the node state does not explain it (shared cores now, none in the history, and
slower; or the reverse, and faster; unless every repeat lies outside the band: repeats run
in rounds, so a busy neighbour shows as spread, and a change in every repeat is a change).
A figure faster than a history that also shared cores is ``NOISY`` whatever its repeats:
contention only adds time, so it is a quieter neighbour, not a change of the code.
Against a reference, a figure outside its bounds is ``NOISY`` when its point shared cores
or its repeats disagree (some of them inside the bounds), else ``FAIL``. Outside a band but
not told apart from noise is ``NOISY``; nothing to compare with is ``NEW``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hpcmem.record.samples import spread
from hpcmem.record.spec import LOWER
from hpcmem.results.history import Baseline
from hpcmem.results.ranktest import mann_whitney_p, smallest_p
from hpcmem.results.references import References
from hpcmem.results.registry import metric
from hpcmem.results.verdict import Row

__all__ = ["Measured", "judge"]


@dataclass(frozen=True)
class Measured:
    """One checked figure of the summary, with the system it is judged for."""

    name: str
    value: float
    unit: str
    system: str
    samples: tuple[float, ...]
    shared_cores: bool | None


def _outside(value: float, low: float | None, high: float | None) -> str | None:
    """``above`` or ``below`` the interval, or None inside it."""
    if low is not None and value < low:
        return "below"
    if high is not None and value > high:
        return "above"
    return None


def _describe(side: str, name: str, against: str) -> str:
    """What lying on ``side`` of a band of metric ``name`` means, compared ``against``."""
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
    row.history_lower_bound, row.history_upper_bound = low, high
    side = _outside(figure.value, low, high)
    if side is None:
        return "PASS", None
    change = (figure.value / history.value - 1) * 100 if history.value else math.inf
    what = f"{_describe(side, metric_name, 'the history')}: {change:+.0f}% vs median"
    if figure.shared_cores and history.shared_runs and _slower(side, metric_name) is False:
        return "NOISY", (f"{what}, the point and {history.shared_runs} of the history's "
                         f"{history.runs} runs shared cores with other work: less contention "
                         "reads as faster, whatever its repeats say")
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


def judge(figure: Measured, references: References, history: Baseline | None,
          min_runs: int) -> Row:
    """The verdict on ``figure``: against its reference, and against its ``history`` once
    that is taken over at least ``min_runs`` runs."""
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
