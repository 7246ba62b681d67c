"""What a finished workflow run says last: the image each benchmark ran in, and the verdict
in a few lines (``onsuccess`` in ``workflow/rules/aggregate.smk``). A regression the config
fails on (``check.fail_on_regression``) is a :class:`RegressionFoundError`, which the workflow
turns into its exit status 1."""

from __future__ import annotations

import os
from collections.abc import Iterable

from hpcmem.errors import HpcmemError
from hpcmem.results.verdict import read_verdict, summary_lines
from hpcmem.workflow.containers import ImageRef

__all__ = ["RegressionFoundError", "image_lines", "report_verdict"]


class RegressionFoundError(HpcmemError):
    """``hpcmem check`` found a regression and the run fails on one."""


def image_lines(image_refs: Iterable[str]) -> list[str]:
    """One line per image reference file of the run: the image and its digest, or why its
    benchmark ran natively."""
    lines = []
    for path in sorted(image_refs):
        image = ImageRef.read(path)
        if image.image:
            lines.append(f"hpcmem: image {image.name}: {image.image} ({image.digest})")
        else:
            lines.append(f"hpcmem: {image.name} ran natively: {image.reason}")
    return lines


def report_verdict(*, verdict_json: str, table: str, report: str, status: str, run_id: str,
                   fail_on_regression: bool) -> None:
    """Print the verdict's short summary (counts, failing and noisy figures, where the
    report and the full ``table`` are); :class:`RegressionFoundError` when ``status`` (the file
    holding ``hpcmem check``'s exit status) says it found one and the run fails on it."""
    html = os.path.abspath(report) if os.path.exists(report) else None
    verdict = read_verdict(verdict_json)
    lines = summary_lines(verdict, report=html, table=os.path.abspath(table))
    print("\n" + "\n".join(lines) + "\n")
    with open(status) as found:
        regression = found.read().strip() != "0"
    if regression and fail_on_regression:
        what = ("judged no figure" if verdict.get("verdict") == "UNJUDGED"
                else "found a regression")
        raise RegressionFoundError(f"hpcmem check {what} in run {run_id}: see {table}")
