"""A scripted fake upstream: a stdlib HTTP server in a thread that records what it received and
answers each request with the next scripted step (JSON, SSE, HTML, a challenge, a dropped
connection...). Steps that must wait for the test block on ``threading.Event``s, never sleeps."""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT = 10.0  # a bound for waits that should end at once; never a timing assertion


@dataclass
class Received:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def message(self) -> Any:
        return json.loads(self.body)


Step = Callable[["_Handler", Received], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        received = Received(self.command, self.path, list(self.headers.items()), body)
        step = self.server.owner.record(received)
        step(self, received)

    do_POST = do_GET = do_DELETE = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeUpstream


class FakeUpstream:
    """Answers each request with the next scripted step, else with ``default``."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._changed = threading.Condition()
        self._steps: deque[Step] = deque()
        self.default: Step = accepted_or_result()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/mcp"

    def script(self, *steps: Step) -> None:
        self._steps.extend(steps)

    def record(self, received: Received) -> Step:
        with self._changed:
            self.received.append(received)
            self._changed.notify_all()
            return self._steps.popleft() if self._steps else self.default

    def wait_for(self, count: int) -> list[Received]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.received) >= count, WAIT), f"upstream got {len(self.received)} of {count}"
            return list(self.received)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def send(h: _Handler, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
         content_type: str | None = "application/json") -> None:
    h.send_response(status)
    if content_type and body:
        h.send_header("Content-Type", content_type)
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def result_for(message: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()


def accepted_or_result(result: Any = None, headers: dict[str, str] | None = None) -> Step:
    """202 for a notification or response; a JSON result (echoing the method) for a request."""

    def step(h: _Handler, got: Received) -> None:
        if h.command != "POST":
            send(h, 405, headers=headers)
            return
        message = got.message()
        if "id" not in message or "method" not in message:
            send(h, 202, headers=headers)
            return
        answer = result if result is not None else {"echo": message["method"], "content": []}
        send(h, 200, result_for(message, answer), headers)

    return step


def raw(status: int, body: bytes, content_type: str | None = "application/json", headers: dict[str, str] | None = None) -> Step:
    def step(h: _Handler, got: Received) -> None:
        send(h, status, body, headers, content_type)

    return step


def with_id(build: Callable[[Any], bytes], status: int = 200, headers: dict[str, str] | None = None) -> Step:
    """A JSON answer built from the request's id."""

    def step(h: _Handler, got: Received) -> None:
        send(h, status, build(got.message()["id"]), headers)

    return step


def sse(*parts: bytes | threading.Event | Callable[[Any], bytes], headers: dict[str, str] | None = None) -> Step:
    """A close-delimited SSE answer: bytes are written as they are, a callable gets the request's
    id, an Event is waited for (the test sets it). Ends when the parts do (no final answer unless
    a part wrote it)."""

    def step(h: _Handler, got: Received) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        ident = got.message().get("id") if got.body else None
        for part in parts:
            if isinstance(part, threading.Event):
                assert part.wait(WAIT), "the test never released the stream"
                continue
            h.wfile.write(part(ident) if callable(part) else part)
            h.wfile.flush()

    return step


def drop() -> Step:
    """Read the request, then close the connection without a byte of answer."""

    def step(h: _Handler, got: Received) -> None:
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)

    return step


def hold(release: threading.Event, then: Step | None = None) -> Step:
    """Read the request and answer only once ``release`` is set (then ``then``, or drop)."""

    def step(h: _Handler, got: Received) -> None:
        assert release.wait(WAIT), "the test never released the held call"
        (then or drop())(h, got)

    return step
