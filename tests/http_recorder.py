"""A real HTTP server on a loopback port, in a thread: it records every request it gets
(path, headers, body) and answers each with the next of its planned answers (then its
default), so a test sees exactly what a client sent and how it took a refusal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Received", "Recorder", "recording_server"]


@dataclass(frozen=True)
class Received:
    """One request as the server got it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """The server's address, what it received, and the answers it is to give."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    #: (status, body) for the next requests, in order; then ``default``
    answers: list[tuple[int, str]] = field(default_factory=list)
    default: tuple[int, str] = (204, "")


@contextmanager
def recording_server() -> Iterator[Recorder]:
    """A :class:`Recorder` serving on a free loopback port until the block ends."""
    recorder = Recorder()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                recorder.received.append(Received("POST", self.path, dict(self.headers), body))
                status, text = (recorder.answers.pop(0) if recorder.answers
                                else recorder.default)
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
