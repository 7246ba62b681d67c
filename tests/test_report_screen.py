"""The report reads at a glance: a nightly-sized sweep (60 points, 15 buffer x binding
series, its history) rendered in headless Debian Chromium at 1400 px, and every figure of
it checked as matplotlib laid it out.

On the page: nothing wider than the window, and every figure's smallest text at least
10 px as displayed. In the figures: no legend over any panel's data area, every title
whole (inside the figure, clear of legends and other panels). In the headline: how many
figures were judged, against what, the regressions and the new ones; "new baseline" when
nothing was judged.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from report_sweep import ADDED, BINDINGS, BUFFERS, SIZES, run_id, sweep_report

from hpcmem.cli import main

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1400
#: the smallest text a figure may show, in CSS pixels as displayed
SMALLEST_PX = 10
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    window: window.innerWidth, page: document.documentElement.scrollWidth,
    images: [...document.images].map(i => [i.alt, i.naturalWidth, i.naturalHeight,
                                           i.getBoundingClientRect().width])});
  document.body.appendChild(out);
});
</script>
"""


def _boxes(figure: Any) -> dict[str, Any]:
    """What one saved figure holds, in display pixels: its panels, legends and titles,
    and its smallest text in points."""
    from matplotlib.text import Text

    renderer = figure._get_renderer()  # the layout as just saved, not drawn again
    panels = [axes for axes in figure.axes if axes.get_visible()]
    legends = [*figure.legends, *(a.get_legend() for a in panels if a.get_legend())]
    titles = [(axes.title, axes) for axes in panels if axes.get_title()]
    titles += [(text, None) for text in (figure._suptitle, figure._supxlabel) if text]
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return {
        "size": tuple(round(v * figure.dpi) for v in figure.get_size_inches()),
        "frame": figure.bbox,
        "panels": [(a, a.get_window_extent(renderer).frozen()) for a in panels],
        "legends": [legend.get_window_extent(renderer).frozen() for legend in legends],
        "titles": [(t.get_text(), t.get_window_extent(renderer).frozen(), a)
                   for t, a in titles],
        "smallest_pt": min(t.get_fontsize() for t in texts),
        "dpi": figure.dpi,
    }


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict]]]:
    """The last night's report, and every figure it saved."""
    from matplotlib.figure import Figure

    saved: list[dict[str, Any]] = []
    original = Figure.savefig

    def savefig(self: Figure, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        saved.append(_boxes(self))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", savefig)
        report = sweep_report(tmp_path_factory.mktemp("sweep"))
    yield report, saved


def _overlap(one: Any, other: Any) -> bool:
    return one.overlaps(other) and min(one.x1, other.x1) - max(one.x0, other.x0) > 1 \
        and min(one.y1, other.y1) - max(one.y0, other.y0) > 1


def test_no_legend_covers_a_panel_and_every_title_is_whole(sweep) -> None:
    report, figures = sweep
    assert len(figures) >= 3  # latency and bandwidth, speedup, history
    for figure in figures:
        for legend in figure["legends"]:
            for axes, box in figure["panels"]:
                assert not _overlap(legend, box), f"a legend over {axes.get_title()!r}"
        for text, box, owner in figure["titles"]:
            frame = figure["frame"]
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, \
                f"title {text!r} cut at the figure's edge"
            assert not any(_overlap(box, legend) for legend in figure["legends"]), text
            assert not any(_overlap(box, other) for axes, other in figure["panels"]
                           if axes is not owner), f"title {text!r} runs into another panel"
    page = report.read_text()
    # 15 series over one op: one panel per binding, one line per buffer kind
    for binding in BINDINGS:
        assert page.count(f"binding {binding}") == 0  # titles are in the figures, not text
    assert len(BUFFERS) * len(BINDINGS) == 15 and len(SIZES) * 15 == 60


def test_chromium_at_1400_px_shows_no_overflow_and_no_text_under_10_px(
    sweep, tmp_path: Path
) -> None:
    report, figures = sweep
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
             f"--window-size={WIDTH},2000"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading"
    seen = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert seen["window"] == WIDTH and seen["page"] <= WIDTH, seen
    assert len(seen["images"]) == len(figures)
    by_size: dict[tuple[int, int], list[dict]] = {}
    for figure in figures:
        by_size.setdefault(figure["size"], []).append(figure)
    for alt, width, height, shown in seen["images"]:
        assert width > 0 and shown > 0, alt
        for figure in by_size[(width, height)]:
            pixels = figure["smallest_pt"] * figure["dpi"] / 72 * shown / width
            assert pixels >= SMALLEST_PX, f"{alt}: text of {pixels:.1f} px"


def test_the_headline_says_what_was_judged_against_what(sweep) -> None:
    report, _ = sweep
    verdict = json.loads((report.parent / "verdict.json").read_text())
    counts = verdict["counts"]
    judged, total = counts["PASS"] + counts["FAIL"], sum(counts.values())
    new = len(SIZES) * 2  # the added series: latency and bus bandwidth at every size
    assert (counts["FAIL"], counts["NEW"]) == (len(SIZES) * 2, new)  # the slowed series
    line = (f"{judged} of {total} figures judged ({judged} against history): "
            f"{counts['FAIL']} regressions, {new} new")
    page = report.read_text()
    assert f'<p class="headline"><span class="badge FAIL">FAIL</span> {line} — system' in page
    header = re.search(r"<header>.*?</header>", page, re.S).group(0)
    assert f"60 points · {line}" in header
    assert '<p class="alert"><strong>20 of 60 points shared their cores</strong>' in page
    assert ADDED[0] in page


def test_a_first_run_is_a_new_baseline(sweep, tmp_path: Path) -> None:
    first = sweep[0].parent.parent / run_id(0)  # checked with no history yet
    out = tmp_path / "report.html"
    assert main(["report", str(first / "summary"), "--verdict", str(first / "verdict.json"),
                 "--out", str(out)]) == 0
    page = out.read_text()
    total = (len(BUFFERS) * len(BINDINGS) - 1) * len(SIZES) * 2  # all but the added series
    assert (f'<span class="badge NEW">NEW BASELINE</span> new baseline: none of {total} '
            f"figures judged (nothing to compare with yet), {total} new — system") in page
    assert "emulated HBW: same DRAM" not in page  # the caveat is in the figures
    assert "Speedup over NumPy buffers (emulated HBW: noise, not a result)" in page
