"""Pytest plugin: ``influxdb``, a real InfluxDB 1.x server for the session.

``influxd`` (Debian's package ``influxdb``) runs as the test user on a free loopback port
with its configuration, data and WAL in a temporary folder, and is stopped at the end of
the session. Without ``influxd`` on PATH the tests that use it fail, saying how to get it.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["InfluxDB", "influxdb"]

#: seconds influxd may take to answer /ping
START_TIMEOUT = 30


@dataclass(frozen=True)
class InfluxDB:
    """A running influxd: its HTTP address and log."""

    url: str
    log: Path

    def _call(self, path: str, params: dict[str, str], body: bytes | None = None) -> bytes:
        request = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(params)}",
                                         data=body, method="POST" if body is not None else "GET")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def create(self, database: str) -> None:
        self._call("/query", {"q": f'CREATE DATABASE "{database}"'}, body=b"")

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


def _config(folder: Path, http: int, rpc: int) -> Path:
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


@pytest.fixture(scope="session")
def influxdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB]:
    """A real influxd on a free loopback port, for the session."""
    influxd = shutil.which("influxd")
    if influxd is None:
        pytest.fail("influxd not found: run `make setup` (Debian package influxdb)")
    folder = tmp_path_factory.mktemp("influxdb")
    http = _free_port()
    config = _config(folder, http, _free_port())
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
