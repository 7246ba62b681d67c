"""OSU's C benchmarks and hpcmem side by side: the installed OSU binaries, their output, and
the comparison table (medians over alternating rounds) as Markdown and as a report section.

``benchmarks/osu_comparison.py`` runs the rounds and writes the table; ``hpcmem report
--osu FILE`` shows it. Per op and size the table holds the medians over rounds of OSU C's
average latency, hpcmem's with its mpi4py loop (the default) and with its native C loop, and
Python's overhead (the median over rounds of mpi4py minus native, both from one run).
"""

from __future__ import annotations

import html
import json
import os
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError

__all__ = [
    "COMPARED_OPS",
    "OsuDirError",
    "find_binaries",
    "html_section",
    "markdown_table",
    "osu_latencies",
    "read_comparison",
    "summarise",
]

#: the collectives compared with OSU's osu_<op>
COMPARED_OPS = ("allreduce", "bcast", "gather")
#: where an OSU install keeps its collective benchmarks, relative to --osu-dir: the folder
#: itself, an install prefix (``make install``, Spack, modules) and a 7.x build tree
_SUBDIRS = ("", "libexec/osu-micro-benchmarks/mpi/collective", "mpi/collective",
            "c/mpi/collective/blocking")
#: the targets: mpi4py loop at 8 B within +0.6 us of OSU C, from 64 KiB on within
#: 1.05x; the native loop within 3% at every size
MPI4PY_SMALL_US = 0.6
MPI4PY_LARGE_RATIO = 1.05
NATIVE_RATIO = 1.03
LARGE_FROM = 64 << 10
_METHODS = ("osu", "mpi4py", "native")


class OsuDirError(BadInputError):
    """--osu-dir does not hold OSU's collective benchmarks; the message names what is missing."""


def find_binaries(osu_dir: str | os.PathLike, ops: Iterable[str] = COMPARED_OPS) -> dict[str, Path]:
    """``op -> osu_<op>`` executable under ``osu_dir`` (an install prefix or the folder of the
    binaries). Raises :class:`OsuDirError` naming the first missing one and where it looked."""
    root = Path(osu_dir)
    if not root.is_dir():
        raise OsuDirError(f"--osu-dir: {str(root)!r} is not a folder; give OSU's install "
                          "prefix or the folder holding osu_allreduce")
    found: dict[str, Path] = {}
    for op in ops:
        candidates = [root / sub / f"osu_{op}" for sub in _SUBDIRS]
        binary = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
        if binary is None:
            looked = ", ".join(str(c.parent) for c in candidates)
            raise OsuDirError(f"--osu-dir: {str(root)!r} has no executable osu_{op} "
                              f"(looked in {looked})")
        found[op] = binary
    return found


def osu_latencies(text: str) -> tuple[str | None, dict[int, float]]:
    """OSU's version (from its title line) and ``size -> average latency (us)`` of its rows."""
    version = None
    latencies: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith("# OSU MPI") and " v" in line:
            version = line.rsplit(" v", 1)[1].strip()
        fields = line.split()
        if fields and not line.startswith("#") and fields[0].isdigit() and len(fields) >= 2:
            latencies[int(fields[0])] = float(fields[1])
    return version, latencies


def summarise(rounds: list[dict[str, dict[str, dict[int, float]]]]) -> list[dict[str, Any]]:
    """Rows per op and size from ``rounds`` (each ``method -> op -> size -> us``): medians
    over rounds, ratios to OSU C and whether each meets its target."""
    rows = []
    for op in COMPARED_OPS:
        sizes = sorted(set.intersection(*(set(r[m].get(op, {})) for r in rounds
                                          for m in _METHODS)))
        for size in sizes:
            series = {m: [r[m][op][size] for r in rounds] for m in _METHODS}
            osu, mpi4py, native = (statistics.median(series[m]) for m in _METHODS)
            row = {
                "op": op,
                "size_bytes": size,
                "osu_us": osu,
                "mpi4py_us": mpi4py,
                "native_us": native,
                "mpi4py_ratio": mpi4py / osu,
                "mpi4py_minus_osu_us": mpi4py - osu,
                "native_ratio": native / osu,
                "python_overhead_us": statistics.median(
                    [p - n for p, n in zip(series["mpi4py"], series["native"], strict=True)]),
                "rounds": series,
            }
            row["targets"] = _targets(row)
            rows.append(row)
    return rows


def _targets(row: Mapping[str, Any]) -> dict[str, bool]:
    met = {"native": row["native_ratio"] <= NATIVE_RATIO}
    if row["size_bytes"] <= 8:
        met["mpi4py"] = row["mpi4py_minus_osu_us"] <= MPI4PY_SMALL_US
    elif row["size_bytes"] >= LARGE_FROM:
        met["mpi4py"] = row["mpi4py_ratio"] <= MPI4PY_LARGE_RATIO
    return met


def _cells(row: Mapping[str, Any]) -> list[str]:
    def mark(method: str) -> str:
        return {True: "", False: " ✗", None: ""}[row["targets"].get(method)]

    return [row["op"], _size(row["size_bytes"]), f"{row['osu_us']:.2f}",
            f"{row['mpi4py_us']:.2f}", f"{row['mpi4py_ratio']:.3f}x{mark('mpi4py')}",
            f"{row['mpi4py_minus_osu_us']:+.2f}", f"{row['native_us']:.2f}",
            f"{row['native_ratio']:.3f}x{mark('native')}", f"{row['python_overhead_us']:+.2f}"]


_HEADERS = ["op", "size", "OSU C (us)", "mpi4py loop (us)", "mpi4py / C", "mpi4py - C (us)",
            "native loop (us)", "native / C", "Python overhead (us)"]


def _size(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def _missed(rows: list[Mapping[str, Any]]) -> list[str]:
    return [f"{row['op']} {_size(row['size_bytes'])} ({method})" for row in rows
            for method, met in row["targets"].items() if not met]


def targets_line(rows: list[Mapping[str, Any]]) -> str:
    """One sentence: which targets were met, which points missed them."""
    checked = sum(len(row["targets"]) for row in rows)
    missed = _missed(rows)
    text = (f"Targets (mpi4py loop: 8 B within +{MPI4PY_SMALL_US} us of OSU C, 64 KiB and up "
            f"within {MPI4PY_LARGE_RATIO}x; native loop within {NATIVE_RATIO}x at every size): "
            f"{checked - len(missed)} of {checked} met")
    return text + (f"; missed (✗): {', '.join(missed)}." if missed else ".")


def markdown_table(rows: list[Mapping[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    lines = ["| " + " | ".join(_HEADERS) + " |",
             "|---|---:|" + "---:|" * (len(_HEADERS) - 2)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def read_comparison(path: str | os.PathLike) -> dict[str, Any]:
    """A comparison written by ``benchmarks/osu_comparison.py``; ValueError when it is not one."""
    try:
        result = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    missing = [key for key in ("date", "command", "commit", "machine", "rounds", "rows")
               if not isinstance(result, dict) or key not in result]
    if missing:
        raise ValueError(f"{path}: not an OSU comparison (no {', '.join(missing)})")
    return result


def html_section(result: Mapping[str, Any]) -> str:
    """The report's part for one comparison: how it was run, the table, the targets."""
    from hpcmem.draw.html import table

    machine = result["machine"]
    facts = (f"{result['date']}, {machine.get('host')} ({machine.get('cpu')}, "
             f"{machine.get('cpus')} CPUs), {machine.get('mpi', {}).get('library')}, "
             f"OSU {result.get('osu', {}).get('version')}, commit {result['commit']}; "
             f"medians of {result['rounds']} alternating rounds")
    rows = [_cells(row) for row in result["rows"]]
    return "\n".join([
        f"<p>{html.escape(facts)}.</p>",
        f"<p>Command: <code>{html.escape(result['command'])}</code></p>",
        table(_HEADERS, rows, ["text", "key", *["num"] * (len(_HEADERS) - 2)]),
        f'<p class="note">{html.escape(targets_line(result["rows"]))}</p>',
    ])
