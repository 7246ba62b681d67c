"""The smallest budget: per work, the least GPU budget hpcmem accepts beside the GPU memory
each peer held at its peak, as a figure and a table under it.

hpcmem's floor is what its probe measured as the least one step needs on the GPU: a refused
budget's ``budget_minimum_bytes`` (a failed record, a row of ``skipped.csv``) or an accepted
run's :data:`~hpcmem.peers.record.FLOOR`; the least over hpcmem's runs of the work, and
"unknown" where none recorded one. A peer's peak is NVML's per-process peak where the
record has it, else PyTorch's reserved peak. A peer point none of whose runs succeeded is
shown failed (or skipped), with why.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import table
from hpcmem.draw.plots import PALETTE, panels
from hpcmem.errors import clip
from hpcmem.peers.record import FLOOR
from hpcmem.peers.section import PANELS, color
from hpcmem.peers.spec import GIB, PEERS
from hpcmem.peers.tables import Work, label, number, rows, shown, work_of
from hpcmem.peers.variants import VARIANTS
from hpcmem.record.samples import read_samples

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Bar", "bars", "draw", "section"]

#: the key's coordinates that are true or false
FLAGS = ("checkpointing", "delayed_update")
#: the characters of a failed run's reason the table shows
REASON = 160


@dataclass(frozen=True)
class Bar:
    """One entry of a work's panel and table: hpcmem's floor or a peer's peak."""

    label: str
    variant: str
    nbytes: float | None  # None: unknown, or the peer's runs failed
    what: str  # where the bytes come from, or why there are none
    failed: bool = False


def _bytes(value: Any) -> float | None:
    """``value`` as a number of bytes above 0, else None."""
    return number(value) or None


def _coordinates(key: str) -> dict[str, Any] | None:
    """The coordinates a peers point key spells (:data:`~hpcmem.peers.spec.PEERS`' parts in
    order, an absent labelled part its implied value), or None for another key."""
    name, *parts = key.split("/")
    if name != PEERS.name:
        return None
    found: dict[str, Any] = {}
    for coordinate in PEERS.coordinates:
        text = None
        if coordinate.label is None:
            text = parts.pop(0) if parts else None
        elif parts and parts[0].startswith(f"{coordinate.label}="):
            text = parts.pop(0).partition("=")[2]
        if text is None and coordinate.implied is None:
            return None
        try:
            value = coordinate.parse(text)
        except ValueError:
            return None
        found[coordinate.name] = value == "True" if coordinate.name in FLAGS else value
    return found if found["variant"] in VARIANTS and not parts else None


def _floor(points: pd.DataFrame, failed: list[tuple[dict[str, Any], Mapping[str, Any]]]
           ) -> dict[Work, tuple[float, str]]:
    """Per work, hpcmem's least floor over its runs (each repeat of an accepted point, each
    refusal) and where it was measured."""
    found: dict[Work, list[tuple[float, str]]] = {}
    for point in points[points["variant"] == "hpcmem"].to_dict("records"):
        budget = shown(_bytes(point["gpu_budget"]), ".2f", GIB, " GiB")
        found.setdefault(work_of(point), []).extend(
            (floor, f"the probe's floor in a run it accepted ({budget} budget)")
            for floor in read_samples(point["samples"]).get(FLOOR, ()) if _bytes(floor))
    for coordinates, left in failed:
        floor = _bytes(left.get("budget_minimum_bytes"))
        if floor is not None and coordinates["variant"] == "hpcmem":
            budget = shown(_bytes(coordinates["gpu_budget"]), ".2f", GIB, " GiB")
            found.setdefault(work_of(coordinates), []).append(
                (floor, f"the probe's floor in a run it refused ({budget} budget)"))
    return {work: min(floors) for work, floors in found.items() if floors}


def bars(points: pd.DataFrame, left_out: pd.DataFrame) -> dict[Work, list[Bar]]:
    """Per work of ``points`` and of the records ``left_out``, in order: hpcmem's floor
    first, then each peer point in :data:`VARIANTS`' order, its peak or its failure."""
    measured = rows(points) if len(points) else {}
    ok = set(points["point"]) if len(points) else set()
    failed = [(coordinates, left) for left in (left_out.to_dict("records") if len(left_out)
                                               else [])
              if (coordinates := _coordinates(str(left["point"]))) is not None]
    floors = _floor(points, failed)
    drawn: dict[Work, list[Bar]] = {}
    for work in sorted({*measured, *(work_of(c) for c, _ in failed)}):
        floor, what = floors.get(work, (None, "unknown: no run recorded the probe's floor"))
        drawn.setdefault(work, [Bar("hpcmem: least budget accepted", "hpcmem", floor, what)])
    for work, table_rows in measured.items():
        drawn[work] += [
            Bar(row.label, row.variant, row.nvml or row.reserved,
                "NVML per-process peak" if row.nvml else "PyTorch reserved peak (no NVML)")
            for row in table_rows if row.variant != "hpcmem"]
    shown_failed: set[str] = set()
    for coordinates, left in sorted(failed, key=lambda f: VARIANTS.index(f[0]["variant"])):
        key = str(left["point"])
        if coordinates["variant"] != "hpcmem" and key not in ok | shown_failed:
            shown_failed.add(key)
            drawn[work_of(coordinates)].append(Bar(
                label(coordinates), coordinates["variant"], None,
                f"{left['status']}: {clip(str(left['reason']), REASON)}", failed=True))
    return drawn


def draw(axes: Any, entries: list[Bar]) -> None:
    """One work's panel: a horizontal bar per entry, hpcmem's floor a dashed line across."""
    places = range(len(entries))[::-1]
    most = max((bar.nbytes for bar in entries if bar.nbytes), default=GIB) / GIB
    for place, bar in zip(places, entries, strict=True):
        if bar.nbytes is None:
            said = "failed (the table says why)" if bar.failed else "floor unknown"
            axes.text(0, place, f" {said}", va="center", fontsize=7, color=PALETTE[3])
            continue
        gib = bar.nbytes / GIB
        axes.barh(place, gib, color=color(bar.variant), height=0.6,
                  hatch="//" if "reserved" in bar.what else None)
        axes.text(gib, place, f" {gib:.2f}", va="center", fontsize=7)
        if bar.variant == "hpcmem":
            axes.axvline(gib, color=PALETTE[0], linestyle="--", linewidth=1)
    axes.set_yticks(list(places), [textwrap.fill(bar.label, 30) for bar in entries],
                    fontsize=6)
    axes.set_xlim(0, most * 1.25)
    axes.set_ylim(-0.7, len(entries) - 0.3)
    axes.set_xlabel("GiB: hpcmem's least budget, each peer's peak")
    axes.grid(True, axis="x", alpha=0.3)


def section(points: pd.DataFrame, left_out: pd.DataFrame) -> str:
    """The smallest-budget figure and its table, or "" where no work has an entry."""
    drawn = bars(points, left_out)
    if not drawn:
        return ""
    figure = panels(list(drawn.items()), draw, **PANELS, title=lambda work: work.title(),
                    alt="peers: hpcmem's least budget against each peer's peak GPU memory",
                    caption="The smallest budget: the least GPU budget hpcmem accepts (its "
                    "probe's floor, from a refused budget or a run it accepted; the dashed "
                    "line) beside the GPU memory each peer held at its peak: NVML's "
                    "per-process peak, else PyTorch's reserved peak (hatched). Failed peers "
                    "and unknown floors are written in.")
    cells = [[work.title(), bar.label, shown(bar.nbytes, ".2f", GIB, missing=None), bar.what]
             for work, entries in drawn.items() for bar in entries]
    return "\n".join([
        "<h3>The smallest budget</h3>", figure,
        table(("work", "variant", "GiB", "measured as"), cells, ("text", "text", "num", "text"))])
