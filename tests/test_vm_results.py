"""Figures measured in a VM are kept apart from real ones: records, summary, check, report.

The same collectives points, recorded on a real node and in a tools/vm guest (records that
name their ``vm_topology``, with latencies a hundred times the real ones), aggregated
together: the VM points are points of their own, outside the derived tables, judged against
no reference or history, and reported in a section of their own.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hpcmem.cli import main
from hpcmem.node.virtual import NOTE, vm_topology
from hpcmem.results.aggregate import aggregate
from hpcmem.results.export.rows import export_rows
from hpcmem.results.summary import read_summary
from hpcmem.results.systems import point_systems

FIXTURES = Path(__file__).parent / "fixtures" / "records" / "collectives"
VM = "knl-flat"
#: a reference every real latency of the fixtures fails (and so would the VM's)
FAILING = ("references:\n  '*:*':\n"
           "    'collectives/*/latency_us.avg': [0.001, -0.1, 0.1, us]\n"
           "    'collectives/allreduce/numpy/float32/ranks=2/binding=cores/size=8/"
           "latency_us.avg': [0.001, -0.1, 0.1, us]\n")


def _records(*, vm: bool) -> list[dict]:
    records = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if vm:
                record.update(host=VM, run_id=f"vm-{record['run_id']}",
                              vm_topology={"name": VM, "note": NOTE},
                              latency_us={k: v * 100 for k, v in record["latency_us"].items()})
            records.append(record)
    return records


def _summary(folder: Path, *, real: bool = True, vm: bool = True) -> Path:
    folder.mkdir(parents=True)
    records = (_records(vm=False) if real else []) + (_records(vm=True) if vm else [])
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    aggregate([folder / "records.jsonl"], folder / "summary")
    return folder / "summary"


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real and the VM records, aggregated together."""
    return _summary(tmp_path_factory.mktemp("both") / "run")


def test_a_guest_says_so_in_its_firmware(tmp_path: Path) -> None:
    (tmp_path / "product_name").write_text("hpcmem-vm\n")
    (tmp_path / "product_version").write_text(f"{VM}\n")
    assert vm_topology(tmp_path) == {"name": VM, "note": NOTE}
    assert "not the hardware's" in NOTE
    (tmp_path / "product_name").write_text("PowerEdge R760\n")
    assert vm_topology(tmp_path) is None
    assert vm_topology(tmp_path / "missing") is None


def test_vm_points_are_points_of_their_own_outside_the_derived_tables(both: Path,
                                                                     tmp_path: Path) -> None:
    summary = read_summary(both).points
    real = summary[summary["vm_topology"] == ""]
    virtual = summary[summary["vm_topology"] == VM]
    assert len(real) == len(virtual) > 0
    assert sorted(virtual["point"]) == sorted(f"{key}/vm={VM}" for key in real["point"])
    # no median mixes the two: each side has its own three repeats
    alone = read_summary(_summary(tmp_path / "real", vm=False)).points
    assert real["latency_us.avg"].tolist() == alone["latency_us.avg"].tolist()
    assert (virtual["latency_us.avg"].to_numpy() == 100 * real["latency_us.avg"].to_numpy()).all()
    for table in ("collectives_latency.csv", "collectives_speedup.csv", "summary.csv"):
        ours, theirs = (folder / table for folder in (both, tmp_path / "real" / "summary"))
        if table == "summary.csv":
            assert VM in ours.read_text() and VM not in theirs.read_text()
        else:  # the tables compare real points with real points only
            assert ours.read_text() == theirs.read_text()


def test_the_check_judges_no_vm_figure(both: Path, tmp_path: Path) -> None:
    """A reference for every system, and a history: the real figures fail it, the VM ones
    are UNJUDGED saying why, and only real figures enter the history."""
    refs = tmp_path / "refs.yaml"
    refs.write_text(FAILING)
    verdict, history = tmp_path / "verdict.json", tmp_path / "history"
    assert main(["check", str(both), "--references", str(refs), "--system", "site:hbm",
                 "--history", str(history), "--verdict-out", str(verdict)]) == 1
    rows = json.loads(verdict.read_text())["figures"]
    virtual = [row for row in rows if f"/vm={VM}/" in row["figure"]]
    assert virtual and all(row["verdict"] == "UNJUDGED" for row in virtual)
    for row in virtual:
        assert row["system"] == f"vm:{VM}" and row["value"] is None
        assert row["reference"] is None and row["history_median"] is None
        assert f"measured in a virtual machine ({VM})" in row["note"]
    real = [row for row in rows if row not in virtual]
    assert {row["verdict"] for row in real if row["figure"].endswith("latency_us.avg")} == {"FAIL"}
    assert {row["system"] for row in real} == {"site:hbm"}
    with sqlite3.connect(history / "history.sqlite") as db:
        assert {s for (s,) in db.execute("SELECT DISTINCT system FROM runs")} == {"site:hbm"}
        names = [name for (name,) in db.execute("SELECT figure FROM figures")]
    assert names and not any("/vm=" in name for name in names)


def test_a_vm_only_run_is_unjudged_and_misses_no_reference(tmp_path: Path, capsys) -> None:
    summary = _summary(tmp_path / "vm", real=False)
    refs = tmp_path / "refs.yaml"
    refs.write_text(FAILING)
    verdict = tmp_path / "verdict.json"
    assert main(["check", str(summary), "--references", str(refs), "--verdict-out",
                 str(verdict)]) == 1
    assert capsys.readouterr().err == (
        "hpcmem check: error: nothing judged: the summary's 24 checked figures were all "
        "measured in virtual machines, which nothing judges; --allow-unjudged accepts such a run\n")
    document = json.loads(verdict.read_text())
    assert document["verdict"] == "UNJUDGED"
    assert {row["verdict"] for row in document["figures"]} == {"UNJUDGED"}  # no MISSING
    rows = list(export_rows(read_summary(summary), point_systems(read_summary(summary))))
    assert rows and {row.system for row in rows} == {f"vm:{VM}"}


def test_the_report_shows_vm_points_apart(both: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(both), "--out", str(out)]) == 0
    page = out.read_text()
    start = page.index('<section id="virtual">')
    section, rest = page[start:page.index("</section>", start)], page[:start]
    assert f"<h2>Virtual machines ({VM})</h2>" in section
    assert "not the hardware&#x27;s" in section and "latency_us.avg" in section
    assert section.count("<tr>") == 1 + len(read_summary(both).points) // 2
    assert "vm=" not in rest  # no table or figure of real points lists a VM point
