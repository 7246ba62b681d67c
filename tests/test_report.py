"""hpcmem report: a self-contained page, rendered for real in headless Debian Chromium."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest
from slurm_site import drawn_jobs

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate

FIXTURES = Path(__file__).parent / "fixtures" / "records"
CHROMIUM = "/usr/bin/chromium"
IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" width="(\d+)" '
                 r'height="(\d+)" alt="([^"]+)">')
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify([...document.images].map(
    i => [i.complete, i.naturalWidth, i.naturalHeight]));
  document.body.appendChild(out);
});
</script>
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Report of every fixture (real and synthetic runs, problems) with a failing verdict."""
    base = tmp_path_factory.mktemp("report")
    aggregate([FIXTURES / "real", FIXTURES / "train", FIXTURES / "problems"], base / "summary")
    refs = base / "refs.yaml"
    refs.write_text("references:\n  '*:*':\n"
                    "    'collectives/allreduce/*/size=8/latency_us.avg': [0.01, -0.1, 0.1, us]\n")
    code = main(["check", str(base / "summary"), "--references", str(refs),
                 "--verdict-out", str(base / "verdict.json")])
    assert code == 1
    assert main(["report", str(base / "summary"), "--verdict", str(base / "verdict.json"),
                 "--out", str(base / "out" / "report.html")]) == 0
    return base / "out" / "report.html"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_page_is_self_contained_with_every_plot_and_section(report: Path) -> None:
    page = report.read_text()
    images = IMG.findall(page)
    alts = [alt for *_, alt in images]
    # one figure per op (3), the speedup figure, the training figure
    assert len(images) == 5, alts
    assert sum("latency and bus bandwidth" in a for a in alts) == 3
    assert any("speedup" in a for a in alts) and any("step time" in a for a in alts)
    for data, width, height, _ in images:
        assert png_size(base64.b64decode(data)) == (int(width), int(height))
    assert not re.search(r'(src|href)="(?!data:|#)', page), "external asset in the page"
    assert "<script" not in page
    for text in ["latency across ranks (µs)", "bus bandwidth (GB/s", "Median step time (ms)",
                 "result differs from the reference", "no CUDA GPU on node01",
                 "problems.jsonl:5", "Open MPI v4.1.4", "emulated (MEMKIND_HBW_NODES)",
                 'class="badge FAIL"', "slower than the reference"]:
        assert text in page, text
    assert not list(report.parent.glob(".*")), "temporary file left behind"


def test_chromium_renders_every_plot(report: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,4000",
                    report.as_uri()], check=True, capture_output=True, timeout=120)
    assert png_size(shot.read_bytes()) == (1400, 4000)
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom)
    assert found, "the page did not finish loading"
    images = json.loads(found.group(1))
    assert len(images) == 5
    for complete, width, height in images:
        assert complete and width >= 800 and height >= 300, images


def test_summary_without_training_or_verdict(tmp_path: Path) -> None:
    aggregate([FIXTURES / "collectives"], tmp_path / "s")
    assert main(["report", str(tmp_path / "s" / "summary.parquet"),
                 "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "No training points in this summary" in page
    assert "None: every record was valid and ran." in page
    assert len(IMG.findall(page)) == 3  # allreduce, bcast, speedup


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    aggregate([FIXTURES / "collectives"], tmp_path / "s")
    (tmp_path / "v.json").write_text('{"verdict": "PASS"')
    assert main(["report", str(tmp_path / "s"), "--verdict", str(tmp_path / "v.json"),
                 "--out", str(tmp_path / "r.html")]) == 2
    assert "--verdict: " in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")]) == 2
    assert "SUMMARY: " in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


_HEADLINE = re.compile(r'<span class="badge (\w+)">\1</span> (\d+) of (\d+) figures judged'
                       r' \(([^)]*)\): (\d+) regressions?((?:, \d+ \w+)*) — system')


def test_the_headline_counts_are_the_verdict_files(report: Path) -> None:
    verdict_file = json.loads((report.parent.parent / "verdict.json").read_text())
    counts = verdict_file["counts"]
    verdict, judged, total, against, failed, rest = _HEADLINE.search(report.read_text()).groups()
    assert verdict == "FAIL"
    assert (int(judged), int(total)) == (counts["PASS"] + counts["FAIL"], sum(counts.values()))
    assert int(failed) == counts["FAIL"] > 0
    # what judged them: the one reference, and the failed points and invalid records
    referenced = sum(f["reference"] is not None and f["verdict"] in ("PASS", "FAIL")
                     for f in verdict_file["figures"])
    assert against == (f"{referenced} against references, {int(judged) - referenced} from "
                       "failed points or records") and referenced > 0
    named = {name.upper(): int(n) for n, name in re.findall(r", (\d+) (\w+)", rest)}
    assert named == {name: counts[name] for name in ("NEW", "NOISY", "MISSING", "UNJUDGED")
                     if counts[name]}
    # the page's header, next to its badge, says it too
    header = re.search(r"<header>.*?</header>", report.read_text(), re.S).group(0)
    assert f" points · {judged} of {total} figures judged ({against})" in header


def test_a_benchmark_points_to_its_skipped_points_only_when_there_are_any(
    report: Path, tmp_path: Path
) -> None:
    # the fixtures' training point without a GPU was skipped: its section says so
    assert ('1 train point failed or skipped: see <a href="#problems">Failed, skipped and '
            'invalid records</a>.' in report.read_text())
    aggregate([FIXTURES / "collectives"], tmp_path / "s")
    assert main(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "No training points in this summary.</p>" in page
    assert 'href="#problems"' not in page and "below" not in page


#: a site's sacct: knows jobs 9 and 1201 of the run, nothing of the others; their
#: allocations (-X), else their use, by job and step
SACCT = r"""#!/bin/sh
case " $* " in
*" -X "*)
  printf '9|batch|hpc|bench|COMPLETED|00:00:12|0:0|\n'
  printf '1201|hbm|hpc|bench|FAILED|00:01:02|1:0|rule_run_collectives_wildcards_a|b\n' ;;
*) printf '9||00:18.000|24\n9.batch|1024K|00:00.010|24\n9.0|3072K|00:17.990|24\n'
   printf '1201||01:02.000|248\n1201.batch||01:02.000|248\n' ;;
esac
"""
#: sacct where accounting is off
NO_ACCOUNTING = "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n"


@pytest.mark.parametrize("sacct", [SACCT, NO_ACCOUNTING], ids=["sacct", "no-accounting"])
def test_the_run_section_lists_every_slurm_job_by_id_with_what_sacct_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sacct: str
) -> None:
    aggregate([FIXTURES / "collectives"], tmp_path / "s")  # records of jobs 1200 to 1202
    journal = tmp_path / "slurm_jobs.jsonl"
    journal.write_text(
        '{"job_id": "10", "points": ["build_wheel", "install_wheel"]}\n'
        '{"job_id": "9", "points": ["run_collectives point=allreduce/numpy/ranks=2/'
        'binding=none"]}\n'
        '{"job_id": "11", "poi')  # being written: left for the next read
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sacct").write_text(sacct)
    (tmp_path / "bin" / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["report", str(tmp_path / "s"), "--slurm-jobs", str(journal),
                 "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    rows = drawn_jobs(page)
    assert [row[0] for row in rows] == ["9", "10", "1200", "1201", "1202"]
    unknown = ["-"] * 8
    if sacct == SACCT:
        assert "As sacct gave them at " in page
        assert rows[0][1:] == ["run_collectives point=allreduce/numpy/ranks=2/binding=none",
                               "batch", "hpc", "bench", "COMPLETED", "00:00:12", "0:0",
                               "3 MiB", "75%"]  # its largest step; 18 of 24 CPU seconds
        # a job only the records name: its points as the executor's comment says
        assert rows[3][1:] == ["rule_run_collectives_wildcards_a|b", "hbm", "hpc", "bench",
                               "FAILED", "00:01:02", "1:0", "-", "25%"]
    else:
        assert ("sacct could not say (`sacct -X -j ID,... --format=JobID,Partition,Account,"
                "QOS,State,Elapsed,ExitCode,Comment` failed: Slurm accounting storage is "
                "disabled)") in html.unescape(page)
        assert rows[0][2:] == rows[3][2:] == unknown
    assert rows[1][1:] == ["build_wheel; install_wheel", *unknown]  # sacct knows nothing of it
    assert rows[2][1:] == ["-", *unknown]


def test_without_a_journal_the_run_section_lists_the_records_job_ids_sorted(
    tmp_path: Path
) -> None:
    aggregate([FIXTURES / "train", FIXTURES / "collectives"], tmp_path / "s")
    assert json.loads((tmp_path / "s" / "metadata.json").read_text())["slurm_job_ids"] == [
        "1300", "1301", "1200", "1201", "1202"]  # as first seen
    assert main(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<dt>Slurm jobs</dt><dd>1200, 1201, 1202, 1300, 1301</dd>" in page
    assert drawn_jobs(page) == []
