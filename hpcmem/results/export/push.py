"""A run's figures pushed to a monitoring server (``hpcmem export --to URL``), every
request's answer checked.

- InfluxDB 1.x: line protocol POSTed to ``URL/write?db=DATABASE&precision=ns`` in batches
  of :data:`BATCH` lines; a token ``user:password`` goes as HTTP basic auth. A database
  the server does not know is created (``CREATE DATABASE`` through ``/query``) and the
  write retried; where the server refuses that, the error says how to create it.
- InfluxDB 2.x: the same to ``URL/api/v2/write?org=ORG&bucket=BUCKET&precision=ns`` with
  ``Authorization: Token TOKEN``.
- Graylog GELF HTTP input: one message per POST to URL.
- An HTTP JSON endpoint (ReFrame's ``httpjson``): one document per point per POST to URL.

The first refused request stops the push: :class:`~.transport.PushError` quotes the
server and says how many figures it had taken before (none, or those of earlier requests,
which stay on the server).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hpcmem.results.export.destination import Destination
from hpcmem.results.export.gelf import gelf_messages
from hpcmem.results.export.httpjson import httpjson_documents
from hpcmem.results.export.influx import influx_lines
from hpcmem.results.export.rows import ExportRow
from hpcmem.results.export.transport import Answer, PushError, basic_auth, post, server_error

__all__ = ["BATCH", "push"]

#: line protocol lines per write request (InfluxDB's advice: 5,000)
BATCH = 5000
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class _Request:
    """One request's body and the figures it carries."""

    body: bytes
    figures: int


def _refused(destination: Destination, answer: Answer, pushed: int, total: int) -> PushError:
    why = server_error(answer) if 200 <= answer.status < 300 else None
    said = f"HTTP {answer.status}: {why}" if why else answer.said()
    return PushError(f"{destination.what} answered {said}; {_taken(pushed, total)}")


def _taken(pushed: int, total: int) -> str:
    if not pushed:
        return "nothing was pushed"
    return f"{pushed} of {total} figures were pushed before (they stay on the server)"


def _accepted(answer: Answer) -> bool:
    return 200 <= answer.status < 300 and server_error(answer) is None


def _influx_write(destination: Destination) -> tuple[str, dict[str, str]]:
    base = destination.url.rstrip("/")
    headers = dict(_TEXT)
    if destination.bucket:
        query = {"org": destination.org or "", "bucket": destination.bucket, "precision": "ns"}
        if destination.token:
            headers["Authorization"] = f"Token {destination.token}"
        return f"{base}/api/v2/write?{urllib.parse.urlencode(query)}", headers
    if destination.token:
        headers["Authorization"] = basic_auth(destination.token)
    query = {"db": destination.database or "", "precision": "ns"}
    return f"{base}/write?{urllib.parse.urlencode(query)}", headers


def _database_missing(answer: Answer) -> bool:
    return answer.status == 404 and "database not found" in (server_error(answer) or "")


def _create_database(destination: Destination, headers: dict[str, str]) -> None:
    """``CREATE DATABASE`` on an InfluxDB 1.x server; PushError saying how to create it
    where the server refuses."""
    name = str(destination.database).replace("\\", "\\\\").replace('"', '\\"')
    statement = f'CREATE DATABASE "{name}"'
    answer = post(f"{destination.url.rstrip('/')}/query",
                  urllib.parse.urlencode({"q": statement}).encode(),
                  {**headers, "Content-Type": "application/x-www-form-urlencoded"})
    if not _accepted(answer):
        why = server_error(answer) or answer.said()
        raise PushError(f"does not exist and the server refused to create it ({why}): "
                        f"have its admin run {statement} (influx -execute '{statement}'), "
                        "then push again")


def _requests(destination: Destination, rows: Sequence[ExportRow]) -> list[_Request]:
    if destination.format == "influx":
        lines = list(influx_lines(rows))
        return [_Request("\n".join(lines[at:at + BATCH]).encode() + b"\n",
                         len(lines[at:at + BATCH])) for at in range(0, len(lines), BATCH)]
    if destination.format == "gelf":
        return [_Request(message.encode(), 1) for message in gelf_messages(rows)]
    return [_Request(json.dumps(document).encode(),
                     sum(key.endswith("_value") for key in document))
            for document in httpjson_documents(rows)]


def push(destination: Destination, rows: Iterable[ExportRow]) -> str:
    """Push every figure of ``rows``; what was done, in words (``42 figures to ...``).
    PushError at the first request the server refuses or that does not reach it."""
    figures = list(rows)
    total = len(figures)
    if destination.format == "influx":
        url, headers = _influx_write(destination)
    else:
        url, headers = destination.url, dict(_JSON)
    created = ""
    pushed = 0
    for request in _requests(destination, figures):
        try:
            answer = post(url, request.body, headers)
            if (not pushed and destination.format == "influx" and not destination.bucket
                    and _database_missing(answer)):
                _create_database(destination, headers)
                created = " (created by this push)"
                answer = post(url, request.body, headers)
        except PushError as error:
            raise PushError(f"{destination.what}: {error}; {_taken(pushed, total)}") from None
        if not _accepted(answer):
            raise _refused(destination, answer, pushed, total)
        pushed += request.figures
    return f"{pushed} figures to {destination.what}{created}"
