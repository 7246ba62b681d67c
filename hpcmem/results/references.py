"""ReFrame-style references: expected figures with relative tolerances, per system:partition.

The YAML file (``config/references.yaml`` documents the format in its header)::

    history:                 # optional: comparison with the median of past runs
      last: 5                # how many past runs, 1 to 1000 (``--last`` overrides)
      min_runs: 3            # judge against the history only once it holds this many (1 to 1000)
      lower: -0.5            # relative tolerance below the history median (<= 0, or null)
      upper: 0.5             # relative tolerance above it (>= 0, or null)
      alpha: 0.01            # significance level of the rank test over repeats (0 < alpha < 1)
      max_spread: 0.5        # (max - min) / median of a point's repeats above which it is noisy
      shared_cores: noisy    # a point that shared cores, outside a band: noisy, or judge it
    references:
      "<system>:<partition>":          # "*" matches any system or partition
        "<figure>": [target, lower, upper, unit]

A figure is ``<point key>/<metric>`` (the point key as ``hpcmem aggregate`` writes
it, the metric as its benchmark's spec names it, with the spec's unit); a pattern may
use ``*`` (any characters, ``/`` included) and ``?``. The
value must lie in ``[target * (1 + lower), target * (1 + upper)]``; ``null``
leaves that side open. Lookup order for a figure: the exact ``system:partition``,
then ``system:*``, then ``*:*``; within one, an exact key before patterns, and
patterns in file order.
"""

from __future__ import annotations

import fnmatch
import math
import os
from dataclasses import dataclass, field
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.record.samples import NOISY_SPREAD
from hpcmem.results.history import MAX_LAST
from hpcmem.results.registry import BENCHMARKS, metric
from hpcmem.textfiles import TextFileError, read_yaml

__all__ = [
    "Reference",
    "References",
    "ReferencesError",
    "load_references",
    "parse_references",
]


_HISTORY_KEYS = ("last", "min_runs", "lower", "upper", "alpha", "max_spread", "shared_cores")
#: accepted values of history.shared_cores
SHARED_CORES = ("noisy", "judge")


class ReferencesError(HpcmemError, ValueError):
    """A references file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Reference:
    """One expected figure: ``target`` with relative ``lower``/``upper`` tolerances."""

    pattern: str
    target: float
    lower: float | None
    upper: float | None
    unit: str

    def bounds(self) -> tuple[float | None, float | None]:
        """The accepted interval; None is an open side."""
        low = None if self.lower is None else self.target * (1 + self.lower)
        high = None if self.upper is None else self.target * (1 + self.upper)
        return low, high


@dataclass
class References:
    """A parsed references file."""

    scopes: dict[str, list[Reference]] = field(default_factory=dict)
    history_last: int = 5
    history_min_runs: int = 3
    history_lower: float | None = -0.5
    history_upper: float | None = 0.5
    history_alpha: float = 0.01
    history_max_spread: float = NOISY_SPREAD
    #: what a figure outside a band gets when its point shared cores: NOISY, or judged anyway
    history_shared_cores: str = "noisy"

    def lookup(self, system: str, figure: str) -> Reference | None:
        """The reference for ``figure`` on ``system`` (``name:partition``), or None."""
        name = system.split(":", 1)[0]
        for scope in dict.fromkeys([system, f"{name}:*", "*:*"]):
            entries = self.scopes.get(scope, [])
            for reference in entries:
                if reference.pattern == figure:
                    return reference
            for reference in entries:
                if fnmatch.fnmatchcase(figure, reference.pattern):
                    return reference
        return None

    def exact_keys(self, system: str) -> list[str]:
        """Figure keys without wildcards that apply to ``system``."""
        name = system.split(":", 1)[0]
        keys: list[str] = []
        for scope in dict.fromkeys([system, f"{name}:*", "*:*"]):
            for reference in self.scopes.get(scope, []):
                if not any(c in reference.pattern for c in "*?[") and reference.pattern not in keys:
                    keys.append(reference.pattern)
        return keys


def _number(value: Any, where: str, *, allow_null: bool = False) -> float | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        accepted = "a number or null" if allow_null else "a number"
        raise ReferencesError(f"{where}: {value!r} is not {accepted}")
    return float(value)


def _tolerances(lower: Any, upper: Any, where: str) -> tuple[float | None, float | None]:
    low = _number(lower, f"{where} (lower)", allow_null=True)
    high = _number(upper, f"{where} (upper)", allow_null=True)
    if low is not None and not -1 <= low <= 0:
        raise ReferencesError(f"{where} (lower): {low:g} must lie in [-1, 0] (or be null)")
    if high is not None and high < 0:
        raise ReferencesError(f"{where} (upper): {high:g} must be >= 0 (or null)")
    return low, high


def _check_pattern(pattern: Any, where: str) -> str:
    if not isinstance(pattern, str) or "/" not in pattern:
        raise ReferencesError(f"{where}: figure {pattern!r} is not '<point key>/<metric>'")
    benchmark, name = pattern.split("/", 1)[0], pattern.rsplit("/", 1)[1]
    if benchmark not in (*BENCHMARKS, "*"):
        accepted = ", ".join(f"{b}/" for b in (*BENCHMARKS, "*"))
        raise ReferencesError(
            f"{where}: figure {pattern!r} starts with {benchmark!r} (accepted: {accepted})"
        )
    specs = BENCHMARKS.values() if benchmark == "*" else [BENCHMARKS[benchmark]]
    accepted = [m.name for spec in specs for m in spec.metrics]
    if name not in accepted:
        raise ReferencesError(
            f"{where}: unknown metric {name!r} (accepted for {benchmark}: {', '.join(accepted)})"
        )
    return pattern


def _reference(pattern: str, value: Any, where: str) -> Reference:
    if not isinstance(value, list) or len(value) != 4:
        raise ReferencesError(f"{where}: {value!r} is not [target, lower, upper, unit]")
    target = _number(value[0], f"{where} (target)")
    assert target is not None
    if target <= 0:
        raise ReferencesError(f"{where} (target): {target:g} must be > 0")
    lower, upper = _tolerances(value[1], value[2], where)
    unit = metric(pattern.rsplit("/", 1)[1]).unit  # _check_pattern accepted the metric
    if value[3] != unit:
        raise ReferencesError(f"{where} (unit): {value[3]!r} is not this figure's unit {unit!r}")
    return Reference(pattern, target, lower, upper, unit)


def parse_references(data: Any, source: str = "references") -> References:
    """Validate the loaded YAML ``data``; raises ``ReferencesError`` naming the bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ReferencesError(f"{source}: the top level must be a mapping, not {kind}")
    unknown = set(data) - {"history", "references"}
    if unknown:
        key = sorted(map(str, unknown))[0]
        raise ReferencesError(f"{source}: unknown key {key!r} (accepted: history, references)")
    refs = References()
    history = data.get("history") or {}
    if not isinstance(history, dict):
        raise ReferencesError(
            f"{source}: history: must be a mapping of last, min_runs, lower, upper"
        )
    unknown = set(history) - {*_HISTORY_KEYS}
    if unknown:
        raise ReferencesError(
            f"{source}: history: unknown key {sorted(map(str, unknown))[0]!r} "
            f"(accepted: {', '.join(_HISTORY_KEYS)})"
        )
    for key in ("last", "min_runs"):
        value = history.get(key, getattr(refs, f"history_{key}"))
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LAST:
            raise ReferencesError(
                f"{source}: history.{key}: {value!r} is not a whole number from 1 to {MAX_LAST}"
            )
        setattr(refs, f"history_{key}", value)
    alpha = _number(history.get("alpha", refs.history_alpha), f"{source}: history.alpha")
    if alpha is None or not 0 < alpha < 1:
        raise ReferencesError(f"{source}: history.alpha: {alpha!r} must lie in (0, 1)")
    spread = _number(history.get("max_spread", refs.history_max_spread),
                     f"{source}: history.max_spread")
    if spread is None or spread <= 0:
        raise ReferencesError(f"{source}: history.max_spread: {spread!r} must be > 0")
    refs.history_alpha, refs.history_max_spread = alpha, spread
    shared = history.get("shared_cores", refs.history_shared_cores)
    if shared not in SHARED_CORES:
        raise ReferencesError(f"{source}: history.shared_cores: {shared!r} is not one of "
                              f"{', '.join(SHARED_CORES)}")
    refs.history_shared_cores = shared
    refs.history_lower, refs.history_upper = _tolerances(
        history.get("lower", refs.history_lower),
        history.get("upper", refs.history_upper),
        f"{source}: history",
    )
    scopes = data.get("references") or {}
    if not isinstance(scopes, dict):
        raise ReferencesError(f"{source}: references: must be a mapping of system:partition")
    for scope, figures in scopes.items():
        where = f"{source}: references[{scope!r}]"
        if not isinstance(scope, str) or scope.count(":") != 1 or "" in scope.split(":"):
            raise ReferencesError(f"{where}: key {scope!r} is not 'system:partition' ('*' allowed)")
        if not isinstance(figures, dict):
            raise ReferencesError(
                f"{where}: must be a mapping of figure -> [target, lower, upper, unit]"
            )
        refs.scopes[scope] = [
            _reference(_check_pattern(p, f"{where}[{p!r}]"), v, f"{where}[{p!r}]")
            for p, v in figures.items()
        ]
    if not any(refs.scopes.values()) and "history" not in data:
        raise ReferencesError(
            f"{source}: no references and no history settings: nothing to check against "
            "(format in config/references.yaml's header)"
        )
    return refs


def load_references(path: str | os.PathLike[str]) -> References:
    """Read and validate a references YAML file; raises ``ReferencesError`` naming the field."""
    try:
        data = read_yaml(path)
    except TextFileError as error:
        raise ReferencesError(str(error)) from None
    return parse_references(data, str(path))
