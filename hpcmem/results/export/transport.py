"""One HTTP POST to a monitoring server, and its answer checked: a status other than 2xx,
or a 2xx whose JSON body holds an ``error`` (InfluxDB's ``/query`` answers 200 with
``{"results": [{"error": ...}]}``), is a :class:`PushError` quoting the server."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from hpcmem.errors import HpcmemError, clip

__all__ = ["TIMEOUT", "Answer", "PushError", "basic_auth", "post", "server_error"]

#: seconds one request may take
TIMEOUT = 30
#: the most characters of a server's answer quoted in a message
_QUOTED = 300


class PushError(HpcmemError):
    """A push the server refused or that never reached it; the message quotes the server."""


@dataclass(frozen=True)
class Answer:
    """A server's answer: its status and body (as text)."""

    status: int
    body: str

    def said(self) -> str:
        """``HTTP 404: {"error":"database not found: \\"x\\""}``, the body clipped."""
        body = " ".join(self.body.split())
        return f"HTTP {self.status}" + (f": {clip(body, _QUOTED)}" if body else "")


def server_error(answer: Answer) -> str | None:
    """The error a 2xx answer's JSON body holds, if any (InfluxDB's ``error`` at the top or
    in a statement's result)."""
    try:
        found = json.loads(answer.body) if answer.body.strip() else None
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    if isinstance(found.get("error"), str):
        return found["error"]
    results = found.get("results")
    errors = [r["error"] for r in results if isinstance(r, dict) and "error" in r] \
        if isinstance(results, list) else []
    return str(errors[0]) if errors else None


def basic_auth(credentials: str) -> str:
    """The ``Authorization`` header value for ``user:password``."""
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to ``url``; the server's answer whatever its status. PushError when no
    answer came (the server cannot be reached, or did not answer in :data:`TIMEOUT` s)."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return Answer(answer.status, answer.read().decode(errors="replace"))
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PushError(f"cannot reach the server ({reason})") from None
