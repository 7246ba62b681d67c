"""Pytest plugin: ``influxdb``, a real InfluxDB 1.x server for the session, and
``influxdb_auth``, one that asks for credentials (started only where a test uses it).

``influxd`` (Debian's package ``influxdb``) runs as the test user on a free loopback port
with its configuration, data and WAL in a temporary folder, and is stopped at the end of
the session. Without ``influxd`` on PATH the tests that use it fail, saying how to get it.
The server with credentials has an admin (:data:`ADMIN`) and a user without any privilege
(:data:`WRITER`), which may write to no database and create none.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ADMIN", "WRITER", "InfluxDB", "influxdb", "influxdb_auth"]

#: seconds influxd may take to answer /ping
START_TIMEOUT = 30
#: user:password of the admin and of the unprivileged user of ``influxdb_auth``
ADMIN = "admin:admin-secret"
WRITER = "writer:writer-secret"


@dataclass(frozen=True)
class InfluxDB:
    """A running influxd: its HTTP address and log."""

    url: str
    log: Path

    #: user:password sent with every call, where the server asks for credentials
    credentials: str | None = None

    def _call(self, path: str, params: dict[str, str], body: bytes | None = None) -> bytes:
        if self.credentials:
            user, _, password = self.credentials.partition(":")
            params = {**params, "u": user, "p": password}
        request = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(params)}",
                                         data=body, method="POST" if body is not None else "GET")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def create(self, database: str) -> None:
        self.execute(f'CREATE DATABASE "{database}"')

    def execute(self, statement: str) -> None:
        """Run an InfluxQL statement that returns nothing (CREATE, GRANT ...)."""
        self._call("/query", {"q": statement}, body=b"")

    def write(self, database: str, lines: str) -> None:
        """POST line protocol to /write (raises on a refusal, with influxd's reason)."""
        self._call("/write", {"db": database, "precision": "ns"}, body=lines.encode())

    def query(self, database: str, query: str) -> list[dict[str, Any]]:
        """The rows of an InfluxQL query, one dict per row (column -> value)."""
        answer = json.loads(self._call("/query", {"db": database, "q": query}))
        series = answer["results"][0].get("series", [])
        return [dict(zip(s["columns"], row, strict=True)) | s.get("tags", {})
                for s in series for row in s["values"]]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _config(folder: Path, http: int, rpc: int, auth: bool) -> Path:
    config = folder / "influxdb.conf"
    config.write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{folder}/meta"
[data]
  dir = "{folder}/data"
  wal-dir = "{folder}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{http}"
  log-enabled = false
  auth-enabled = {"true" if auth else "false"}
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
""")
    return config


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=1) as answer:
            return answer.status == 204
    except OSError:
        return False


@contextmanager
def _running(folder: Path, auth: bool = False) -> Iterator[InfluxDB]:
    """influxd on a free loopback port, with its files in ``folder``, until the block ends."""
    influxd = shutil.which("influxd")
    if influxd is None:
        pytest.fail("influxd not found: run `make setup` (Debian package influxdb)")
    http = _free_port()
    config = _config(folder, http, _free_port(), auth)
    server = InfluxDB(f"http://127.0.0.1:{http}", folder / "influxd.log")
    with open(server.log, "wb") as log:
        process = subprocess.Popen([influxd, "run", "-config", str(config)], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(server.url):
            assert process.poll() is None, f"influxd exited: {server.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"influxd did not answer in {START_TIMEOUT}s"
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def influxdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    """A real influxd on a free loopback port, for the session."""
    with _running(tmp_path_factory.mktemp("influxdb")) as server:
        yield server


@pytest.fixture(scope="session")
def influxdb_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    """A real influxd that asks for credentials: an admin (its calls are the admin's) and
    :data:`WRITER`, a user without privileges."""
    with _running(tmp_path_factory.mktemp("influxdb-auth"), auth=True) as server:
        user, _, password = ADMIN.partition(":")
        server.execute(f"CREATE USER {user} WITH PASSWORD '{password}' WITH ALL PRIVILEGES")
        admin = replace(server, credentials=ADMIN)
        user, _, password = WRITER.partition(":")
        admin.execute(f"CREATE USER {user} WITH PASSWORD '{password}'")
        yield admin
