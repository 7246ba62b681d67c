"""`hpcmem export --to URL`: a run's figures pushed to a real server, every answer checked.

InfluxDB 1.x for real (tests/influxdb_server.py): a fresh server without the database gets
it created and the figures are queried back; a stopped server, wrong credentials, and a
database the user may not create each exit 4 quoting the server, nothing reported pushed.
InfluxDB 2.x, Graylog GELF HTTP and an HTTP JSON endpoint against a real HTTP server in a
thread (tests/http_recorder.py) that records what it got and answers errors when told.
Options that cannot push are one line, exit 2, before anything is sent.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from http_recorder import recording_server
from influxdb_server import WRITER, InfluxDB
from test_export import FIXTURES, HBW8, SYSTEM, finite_figures, gelf_problems, hpcmem

from hpcmem.results.aggregate import aggregate
from hpcmem.results.export.destination import TOKEN


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("push") / "summary"
    aggregate([FIXTURES / "collectives", FIXTURES / "train"], folder)
    return folder


def push(summary: Path, *args: str) -> tuple[int, str, str]:
    return hpcmem("export", str(summary), "--system", SYSTEM, *args)


def stopped_server() -> str:
    """The URL of a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_a_fresh_influxdb_gets_the_database_and_every_figure(summary: Path,
                                                             influxdb: InfluxDB) -> None:
    code, out, err = push(summary, "--format", "influx", "--to", influxdb.url,
                          "--database", "fresh")
    figures = finite_figures(summary)
    assert (code, out) == (0, "")
    assert err == (f"hpcmem export: pushed {len(figures)} figures to InfluxDB 1.x database "
                   f"'fresh' at {influxdb.url} (created by this push)\n")
    rows = influxdb.query("fresh", 'SELECT "value" FROM "hpcmem" GROUP BY "point", "metric"')
    assert {(r["point"], r["metric"]): r["value"] for r in rows} == figures
    # the next night's push finds the database
    code, _, err = push(summary, "--format", "influx", "--to", influxdb.url,
                        "--database", "fresh")
    assert code == 0 and "created" not in err


def test_a_stopped_server_exits_4_and_nothing_is_pushed(summary: Path) -> None:
    url = stopped_server()
    code, out, err = push(summary, "--format", "influx", "--to", url, "--database", "night")
    assert (code, out) == (4, "")
    assert err == (f"hpcmem export: error: --to: InfluxDB 1.x database 'night' at {url}: cannot "
                   "reach the server ([Errno 111] Connection refused); nothing was pushed\n")


def test_wrong_credentials_exit_4_quoting_the_server(
    summary: Path, influxdb_auth: InfluxDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    influxdb_auth.create("night")
    monkeypatch.setenv(TOKEN, "admin:wrong")
    code, _, err = push(summary, "--format", "influx", "--to", influxdb_auth.url,
                        "--database", "night")
    assert code == 4
    assert err == (f"hpcmem export: error: --to: InfluxDB 1.x database 'night' at "
                   f'{influxdb_auth.url} answered HTTP 401: {{"error":"authorization failed"}}; '
                   "nothing was pushed\n")
    assert influxdb_auth.query("night", 'SELECT count("value") FROM "hpcmem"') == []


def test_a_database_the_user_may_not_create_says_how_to(
    summary: Path, influxdb_auth: InfluxDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a misspelt database: the user may write, not create
    influxdb_auth.create("night")
    influxdb_auth.execute(f'GRANT WRITE ON "night" TO {WRITER.partition(":")[0]}')
    monkeypatch.setenv(TOKEN, WRITER)
    code, _, err = push(summary, "--format", "influx", "--to", influxdb_auth.url,
                        "--database", "nigth")
    assert code == 4
    assert err.startswith(f"hpcmem export: error: --to: InfluxDB 1.x database 'nigth' at "
                          f"{influxdb_auth.url}: does not exist and the server refused to "
                          "create it (error authorizing query: writer not authorized to "
                          "execute statement 'CREATE DATABASE nigth', requires admin "
                          "privilege): have its admin run CREATE DATABASE \"nigth\""), err
    assert err.endswith("then push again; nothing was pushed\n") and err.count("\n") == 1
    code, _, err = push(summary, "--format", "influx", "--to", influxdb_auth.url,
                        "--database", "night")
    assert (code, err.startswith("hpcmem export: pushed ")) == (0, True), err


def test_influxdb_2_gets_the_bucket_and_the_token(summary: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN, "s3cret-token")
    with recording_server() as server:
        code, _, err = push(summary, "--format", "influx", "--to", server.url,
                            "--org", "hpc", "--bucket", "nightly")
        server.answers.append((401, '{"code":"unauthorized","message":"unauthorized access"}'))
        refused = push(summary, "--format", "influx", "--to", server.url,
                       "--org", "hpc", "--bucket", "nightly")
    assert code == 0, err
    first = server.received[0]
    assert first.path == "/api/v2/write?org=hpc&bucket=nightly&precision=ns"
    assert first.headers["Authorization"] == "Token s3cret-token"
    lines = first.body.decode().splitlines()
    assert len(lines) == len(finite_figures(summary))
    assert refused[0] == 4
    assert refused[2] == (f"hpcmem export: error: --to: InfluxDB 2.x bucket 'nightly' of org "
                          f"'hpc' at {server.url} answered HTTP 401: {{\"code\":\"unauthorized\","
                          '"message":"unauthorized access"}; nothing was pushed\n')


def test_gelf_messages_reach_graylog_one_per_request(summary: Path) -> None:
    with recording_server() as server:
        server.default = (202, "")
        code, _, err = push(summary, "--format", "gelf", "--to", f"{server.url}/gelf")
    figures = finite_figures(summary)
    assert (code, err) == (0, f"hpcmem export: pushed {len(figures)} figures to Graylog GELF "
                              f"endpoint {server.url}/gelf\n")
    messages = [json.loads(request.body) for request in server.received]
    assert {request.path for request in server.received} == {"/gelf"}
    assert [problem for m in messages for problem in gelf_problems(m)] == []
    assert {(m["_point"], m["_metric"]): m["_value"] for m in messages} == figures


def test_a_refusal_midway_says_what_stays_on_the_server(summary: Path) -> None:
    with recording_server() as server:
        server.answers = [(202, "")] * 3 + [(400, "Unable to parse GELF message")]
        code, _, err = push(summary, "--format", "gelf", "--to", f"{server.url}/gelf")
    total = len(finite_figures(summary))
    assert code == 4
    assert err == (f"hpcmem export: error: --to: Graylog GELF endpoint {server.url}/gelf "
                   "answered HTTP 400: Unable to parse GELF message; 3 of "
                   f"{total} figures were pushed before (they stay on the server)\n")
    assert len(server.received) == 4


def test_httpjson_documents_carry_each_point_as_reframe_does(summary: Path) -> None:
    with recording_server() as server:
        code, _, err = push(summary, "--format", "httpjson", "--to", f"{server.url}/rfm")
        server.answers.append((200, '{"error": "quota exceeded"}'))  # a 2xx that says no
        refused = push(summary, "--format", "httpjson", "--to", f"{server.url}/rfm")
    assert code == 0, err
    documents = [json.loads(r.body) for r in server.received[:-1]]
    assert {r.headers["Content-Type"] for r in server.received} == {"application/json"}
    pushed = {(d["check_name"], key.removeprefix("check_perf_").removesuffix("_value")): value
              for d in documents for key, value in d.items()
              if key.startswith("check_perf_") and key.endswith("_value")}
    assert pushed == finite_figures(summary)
    [hbw8] = [d for d in documents if d["check_name"] == HBW8]
    assert (hbw8["check_system"], hbw8["check_partition"]) == ("site", "batch")
    assert hbw8["check_perf_latency_us.avg_unit"] == "us"
    assert refused[0] == 4
    assert refused[2] == (f"hpcmem export: error: --to: HTTP JSON endpoint {server.url}/rfm "
                          "answered HTTP 200: quota exceeded; nothing was pushed\n")


@pytest.mark.parametrize(("args", "line"), [
    (["--format", "perflog", "--to", "http://h:1"],
     "--format: 'perflog' is not pushed to a server (accepted: influx, gelf, httpjson with "
     "--to; write perflog with --out)"),
    (["--format", "influx", "--to", "http://u:pw@h:8086", "--database", "d"],
     "--to: 'http://u:pw@h:8086' holds credentials (the command line is public) (accepted: "
     f"a URL without them; put the token in ${TOKEN})"),
    (["--format", "influx", "--to", "http://h:8086/write?db=d"],
     "--to: 'http://h:8086/write?db=d' holds a query"),
    (["--format", "influx", "--to", "ftp://h"], "--to: 'ftp://h' is not an HTTP URL"),
    (["--format", "influx", "--to", "http://h:8086"],
     "--database, --bucket: neither is given (accepted: --database for InfluxDB 1.x, or "
     "--org and --bucket for InfluxDB 2.x)"),
    (["--format", "influx", "--to", "http://h:8086", "--bucket", "b"],
     "--org: not given with --bucket"),
    (["--format", "influx", "--to", "http://h:8086", "--database", "a b"],
     "--database: 'a b' is not a name (accepted: 1 to 64 letters"),
    (["--format", "gelf", "--to", "http://h/gelf", "--database", "d"],
     "--database: 'd' is no setting of --format gelf"),
    (["--format", "influx", "--database", "d"],
     "--database: 'd' is a setting of --to, which is not given"),
    (["--format", "gelf", "--to", "http://h/gelf", "--out", "x"],
     "--to: 'http://h/gelf' and --out 'x': give one"),
], ids=["perflog", "credentials", "query", "scheme", "no-database", "no-org", "bad-name",
        "database-for-gelf", "no-to", "to-and-out"])  # fmt: skip
def test_options_that_cannot_push_exit_2_naming_the_option(
    summary: Path, args: list[str], line: str
) -> None:
    code, out, err = push(summary, *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"hpcmem export: error: {line}"), err
    assert err.count("\n") == 1
