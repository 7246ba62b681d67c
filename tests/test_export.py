"""`hpcmem export` taken by the real thing: the line protocol written into a real InfluxDB
1.x and the figures queried back; GELF messages held to the GELF 1.1 spec's rules; the
perflog and CSV parsed back; bad input one line naming the field, exit 2, nothing written.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from influxdb_server import InfluxDB

from hpcmem.cli import main
from hpcmem.results.aggregate import aggregate
from hpcmem.results.summary import read_summary

FIXTURES = Path(__file__).parent / "fixtures" / "records"
HBW8 = "collectives/allreduce/hbw/float32/ranks=2/binding=cores/size=8"
SYSTEM = "site:batch"
#: figures of the fixtures: one inside its band, one outside (a FAIL)
REFERENCES = {f"{HBW8}/latency_us.avg": [1.05, -0.1, 0.1, "us"],
              f"{HBW8}/busbw_GBps": [1.0, -0.1, 0.1, "GB/s"]}


def hpcmem(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The fixtures' summary and the verdict `hpcmem check` gave it."""
    folder = tmp_path_factory.mktemp("export")
    aggregate([FIXTURES / "collectives", FIXTURES / "train"], folder / "summary")
    refs = folder / "refs.yaml"
    refs.write_text(yaml.safe_dump({"references": {"*:*": REFERENCES}}))
    code, out, _ = hpcmem("check", str(folder / "summary"), "--references", str(refs),
                          "--system", SYSTEM, "--verdict-out", str(folder / "verdict.json"))
    assert code == 1, out  # busbw is far outside its band
    return folder / "summary", folder / "verdict.json"


def exported(run: tuple[Path, Path], kind: str) -> list[str]:
    summary, verdict = run
    code, out, err = hpcmem("export", str(summary), "--format", kind, "--verdict", str(verdict),
                            "--system", SYSTEM)
    assert (code, err) == (0, "")
    return out.splitlines()


def finite_figures(summary: Path) -> dict[tuple[str, str], float]:
    """Every finite number of the summary's metric columns, by point and metric."""
    from hpcmem.results.registry import BENCHMARKS

    found = {}
    for point in read_summary(summary).points.to_dict("records"):
        for metric in BENCHMARKS[point["benchmark"]].metrics:
            value = point[metric.name]
            if metric.applies(point) and isinstance(value, float | int) and math.isfinite(value):
                found[(point["point"], metric.name)] = float(value)
    return found


def test_influx_lines_are_written_into_influxdb_and_queried_back(
    run: tuple[Path, Path], influxdb: InfluxDB
) -> None:
    influxdb.create("nightly")
    lines = exported(run, "influx")
    influxdb.write("nightly", "\n".join(lines))
    figures = finite_figures(run[0])
    rows = influxdb.query("nightly", 'SELECT "value", "unit", "verdict", "partition" FROM '
                                     '"hpcmem" GROUP BY "point", "metric"')
    assert len(rows) == len(lines) == len(figures)
    assert {(r["point"], r["metric"]): r["value"] for r in rows} == figures
    latency = influxdb.query("nightly", f"""SELECT "value", "verdict", "unit" FROM "hpcmem"
        WHERE "point" = '{HBW8}' AND "metric" = 'latency_us.avg' AND "system" = '{SYSTEM}'""")
    assert [(r["value"], r["verdict"], r["unit"]) for r in latency] == [(1.0, "PASS", "us")]
    verdicts = json.loads(run[1].read_text())["figures"]
    failed = influxdb.query("nightly", """SELECT count("value") FROM "hpcmem"
        WHERE "verdict" = 'FAIL' AND "partition" = 'batch'""")
    assert failed[0]["count"] == sum(f["verdict"] == "FAIL" for f in verdicts) == 1


#: GELF 1.1: an additional field's name (and never _id)
_ADDITIONAL = re.compile(r"^_[\w.\-]*$")


def gelf_problems(message: dict) -> list[str]:
    """What a GELF 1.1 message breaks of the spec's rules (required fields and their types,
    additional fields' names and values); empty when it is a valid message."""
    problems = []
    if message.get("version") != "1.1":
        problems.append(f"version: {message.get('version')!r}, not '1.1'")
    for name in ("host", "short_message"):
        if not (isinstance(message.get(name), str) and message[name].strip()):
            problems.append(f"{name}: not a non-empty string")
    timestamp = message.get("timestamp")
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or timestamp < 0:
        problems.append("timestamp: not seconds since the epoch")
    if message.get("level") not in range(8):
        problems.append("level: not a syslog level 0-7")
    for name, value in message.items():
        if name in ("version", "host", "short_message", "full_message", "timestamp", "level"):
            continue
        if not _ADDITIONAL.match(name) or name == "_id":
            problems.append(f"{name}: not an additional field name")
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            problems.append(f"{name}: {value!r} is neither a string nor a number")
    return problems


def test_gelf_messages_are_valid_gelf_carrying_each_figure(run: tuple[Path, Path]) -> None:
    messages = [json.loads(line) for line in exported(run, "gelf")]
    assert [problem for m in messages for problem in gelf_problems(m)] == []
    figures = finite_figures(run[0])
    assert {(m["_point"], m["_metric"]): m["_value"] for m in messages} == figures
    [failed] = [m for m in messages if m.get("_verdict") == "FAIL"]
    assert (failed["_metric"], failed["level"], failed["_partition"]) == ("busbw_GBps", 3, "batch")
    assert gelf_problems({"version": "1.1", "host": "", "timestamp": "now", "_id": 1,
                          "_ok": True, "level": 9}) == [
        "host: not a non-empty string", "short_message: not a non-empty string",
        "timestamp: not seconds since the epoch", "level: not a syslog level 0-7",
        "_id: not an additional field name", "_ok: True is neither a string nor a number"]


_PERFLOG = re.compile(r"(?P<time>[^|]+)\|hpcmem (?P<version>[^|]+)\|(?P<point>\S+) on "
                      r"(?P<system>\S+) using hpcmem\|jobid=(?P<job>[^|]+)\|(?P<metric>[^=|]+)="
                      r"(?P<value>[^|]+)\|ref=(?P<ref>\S+) \(l=(?P<low>\S+), u=(?P<high>\S+)\)"
                      r"\|(?P<unit>[^|]*)\|result=(?P<result>\w+)")


def test_perflog_lines_read_back(run: tuple[Path, Path]) -> None:
    parsed = [_PERFLOG.fullmatch(line) for line in exported(run, "perflog")]
    assert all(parsed)
    figures = finite_figures(run[0])
    assert {(m["point"], m["metric"]): float(m["value"]) for m in parsed} == figures
    [latency] = [m for m in parsed if m["point"] == HBW8 and m["metric"] == "latency_us.avg"]
    assert (latency["system"], latency["ref"], latency["result"]) == (SYSTEM, "1.05", "PASS")
    assert float(latency["low"]) == pytest.approx(-0.1)
    assert float(latency["high"]) == pytest.approx(0.1)


def test_csv_reads_back(run: tuple[Path, Path]) -> None:
    rows = list(csv.DictReader(exported(run, "csv")))
    assert {(r["point"], r["metric"]): float(r["value"]) for r in rows} == finite_figures(run[0])
    assert {r["partition"] for r in rows} == {"batch"}


def test_bad_input_exits_2_naming_the_field(run: tuple[Path, Path], tmp_path: Path) -> None:
    summary, verdict = run
    other = tmp_path / "other.json"
    other.write_text(verdict.read_text().replace('"run_id": "', '"run_id": "other-'))
    broken = tmp_path / "broken.json"
    broken.write_text(verdict.read_text().replace('"value": 1.0', '"value": "fast"', 1))
    out = tmp_path / "out.txt"
    for args, line in (
        (["--verdict", str(other)], "hpcmem export: error: --verdict: run_id: 'other-"),
        (["--verdict", str(broken)], f"hpcmem export: error: --verdict: {broken}: figures["),
        (["--system", "nocolon"], "hpcmem export: error: --system: 'nocolon' is not "
                                  "NAME:PARTITION"),
    ):
        code, printed, err = hpcmem("export", str(summary), "--format", "influx",
                                    "--out", str(out), *args)
        assert (code, printed) == (2, ""), err
        assert err.startswith(line) and err.count("\n") == 1, err
        assert not out.exists()
    code, _, err = hpcmem("export", str(tmp_path), "--format", "csv")
    assert code == 2 and err.startswith(f"hpcmem export: error: SUMMARY: {tmp_path}: no ")
