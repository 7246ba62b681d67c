"""The report's native-against-container section: which image the points ran in, where they
ran natively, and each registered benchmark's own comparison of the two (its
``Reporting.native_section``), of the points measured on real nodes."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from hpcmem.draw.html import section
from hpcmem.results.registry import REPORTS
from hpcmem.results.summary import benchmark_points
from hpcmem.results.virtual import split

if TYPE_CHECKING:
    from hpcmem.results.summary import Summary

__all__ = ["container_section"]

TITLE = "Native against container"


def _image_line(containers: list[dict[str, Any]]) -> str:
    parts = []
    for box in containers:
        runtime = " ".join(str(box.get(k)) for k in ("runtime", "runtime_version") if box.get(k))
        parts.append(f"<code>{html.escape(str(box.get('image')))}</code> "
                     f"({html.escape(str(box.get('digest')))}"
                     + (f", {html.escape(runtime)}" if runtime else "") + ")")  # fmt: skip
    return ", ".join(parts)


def container_section(summary: Summary, native: Summary) -> str:
    """The section for ``summary`` (run in images) against ``native`` (the same points run
    natively): the image, then each benchmark's comparison of its points."""
    containers = summary.metadata.get("containers") or []
    if not containers:
        return section(TITLE, '<p class="note">The sweep ran natively (no image could be built '
                       "or run; the workflow said why), so there is no overhead to show.</p>",
                       anchor="container")  # fmt: skip
    hosts = html.escape(", ".join(native.metadata.get("hosts") or []))
    parts = [f"<p>The same points ran in {_image_line(containers)} and natively on {hosts}; "
             "the overhead is the container's latency over the native one.</p>"]
    (contained, _), (natively, _) = split(summary.points), split(native.points)
    for name, reporting in REPORTS.items():
        if reporting.native_section is not None:
            parts.append(reporting.native_section(benchmark_points(contained, name),
                                                  benchmark_points(natively, name)))
    return section(TITLE, *parts, anchor="container")
