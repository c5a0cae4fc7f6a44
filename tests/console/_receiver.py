"""A real HTTP webhook receiver on loopback: a stdlib ``ThreadingHTTPServer`` in a thread that
records every request (before answering it) and answers with the statuses it is given."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """``url`` to post to; ``received`` in arrival order; ``answer(*statuses)`` queues the next
    statuses (200 once the queue is empty)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._statuses: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.received.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver._statuses.pop(0) if receiver._statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def answer(self, *statuses: int) -> None:
        with self._lock:
            self._statuses.extend(statuses)

    def on(self, path: str) -> list[Received]:
        """What arrived on ``path`` (several targets can share one receiver by path)."""
        with self._lock:
            return [r for r in self.received if r.path == path]

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Iterable[Any]) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
