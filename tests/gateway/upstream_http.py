"""The test upstream over streamable HTTP: the SDK's app under uvicorn, optionally misbehaving.

``serve()`` runs it in a background thread on ``127.0.0.1`` (port picked by the OS) and returns
once uvicorn has started. The SDK routes by the ``MCP-Protocol-Version`` header: a handshake-era
version (or none) goes to its session transport (stateful unless ``stateless``), ``2026-07-28``
to its single-exchange path, so one server serves ``mode="legacy"`` and ``mode="auto"`` clients.

A misbehaving mode wraps the app in ASGI middleware: for a ``tools/call`` POST it buffers the
app's response and, if the tool ran (the tool reports the probe header the middleware stamped on
the request), sends something else instead. ``challenge`` answers 401 before the app sees the call.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context

from .upstream import PROBE_HEADER, build_server

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

HTTP_MODES = ("truncate_after", "html404_after", "html500_after", "invalid_request_after", "drop_after", "challenge")
PATH = "/mcp"
CHALLENGE = 'Bearer realm="upstream", error="invalid_token", error_description="the token expired"'
MODERN_REVISION = "2026-07-28"


@dataclass(frozen=True)
class Served:
    """A running upstream: its MCP endpoint URL and how to stop it."""

    url: str
    close: Callable[[], None]


def _html(status: int, title: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = f"<!DOCTYPE html><html><head><title>{title}</title></head><body><h1>{title}</h1></body></html>"
    return status, [(b"content-type", b"text/html; charset=utf-8")], body.encode()


def _header(scope: Scope, name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), None)


class _Buffer:
    """Collects the app's response to one call; passes it through once it must flow unchanged."""

    def __init__(self, send: Send, probe: str, armed: set[str]) -> None:
        self.downstream = send
        self.probe = probe
        self.armed = armed
        self.messages: list[Message] = []
        self.passing = False

    async def send(self, message: Message) -> None:
        if self.passing:
            await self.downstream(message)
            return
        self.messages.append(message)
        if message["type"] == "http.response.body" and message.get("more_body") and self.probe not in self.armed:
            # Part of a stream reached us before the tool ran (a question asked mid-call over SSE):
            # this call is not misbehaved with, the client gets it all as it comes.
            await self.flush()

    async def flush(self) -> None:
        self.passing = True
        for message in self.messages:
            await self.downstream(message)
        self.messages.clear()

    def status_and_body(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        return int(start["status"]), list(start.get("headers", [])), body


class Misbehaving:
    """ASGI middleware: lets a ``tools/call`` run, then replaces or withholds its answer."""

    def __init__(self, app: App, mode: str, armed: set[str]) -> None:
        if mode not in HTTP_MODES:
            raise ValueError(f"misbehave {mode!r}: over HTTP, use one of {', '.join(HTTP_MODES)}")
        self.app = app
        self.mode = mode
        self.armed = armed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        replay = _replaying(body, receive)
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        if not (isinstance(message, dict) and message.get("method") == "tools/call"):
            await self.app(scope, replay, send)
            return
        if self.mode == "challenge":
            await _respond(send, 401, [(b"content-type", b"text/plain"), (b"www-authenticate", CHALLENGE.encode())],
                           b"Unauthorized")  # fmt: skip
            return
        probe = uuid.uuid4().hex
        stamped = {**scope, "headers": [*scope["headers"], (PROBE_HEADER.encode(), probe.encode())]}
        buffer = _Buffer(send, probe, self.armed)
        await self.app(stamped, replay, buffer.send)
        if buffer.passing:
            return
        if probe not in self.armed:
            await buffer.flush()
            return
        self.armed.discard(probe)
        await self.misbehave(scope, receive, send, message, buffer)

    async def misbehave(self, scope: Scope, receive: Receive, send: Send, request: dict[str, Any],
                        buffer: _Buffer) -> None:  # fmt: skip
        """Send the mode's failure instead of the buffered answer of a call whose tool ran."""
        mode = self.mode
        sys.stderr.write(f"upstream: {mode}: the tool ran, answering otherwise\n")
        if mode == "drop_after":
            # Close the connection without a status line; wait for uvicorn to notice the loss, so it
            # does not try to answer 500 itself.
            cycle = getattr(receive, "__self__", None)
            transport = getattr(cycle, "transport", None)
            if transport is None:
                raise RuntimeError("drop_after needs uvicorn's h11 protocol (receive.__self__.transport)")
            transport.close()
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        if mode in ("html404_after", "html500_after"):
            status, headers, body = _html(404, "404 Not Found") if mode == "html404_after" else _html(
                500, "500 Internal Server Error")  # fmt: skip
        elif mode == "invalid_request_after":
            modern = _header(scope, b"mcp-protocol-version") == MODERN_REVISION
            # The status the SDK's own 2026-07-28 path gives -32600; 200 in the handshake era.
            status = 400 if modern else 200
            headers = [(b"content-type", b"application/json")]
            error = {"code": -32600, "message": "Invalid request (sent after the tool ran)"}
            answer = {"jsonrpc": "2.0", "id": request.get("id"), "error": error}
            body = json.dumps(answer, separators=(",", ":")).encode()
        else:  # truncate_after: the app's own answer, cut in the middle of its JSON
            status, headers, full = buffer.status_and_body()
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            body = full[: len(full) // 2]
        await _respond(send, status, headers, body)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the already-read body, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def build_app(counter: Path, misbehave: str | None = None, *, stateless: bool | None = None,
              json_response: bool = False) -> App:  # fmt: skip
    """The ASGI app serving the test upstream at ``/mcp`` (``stateless=None``: the SDK's default)."""
    armed: set[str] = set()

    def ran(ctx: Context) -> None:
        probe = (ctx.headers or {}).get(PROBE_HEADER)
        if probe is not None:
            armed.add(probe)

    server = build_server(counter, ran if misbehave is not None else None)
    app: App = server.streamable_http_app(
        streamable_http_path=PATH, stateless_http=bool(stateless), json_response=json_response
    )
    return app if misbehave is None else Misbehaving(app, misbehave, armed)


class _Server(uvicorn.Server):
    """uvicorn, reporting once it has started (or failed to)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.ready.set()


def _config(app: App) -> uvicorn.Config:
    return uvicorn.Config(app, http="h11", ws="none", lifespan="on", log_level="warning",
                          timeout_graceful_shutdown=5)  # fmt: skip


def _bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def serve(counter: Path, misbehave: str | None = None, *, stateless: bool | None = None,
          json_response: bool = False, start_timeout: float = 30.0) -> Served:  # fmt: skip
    """Start the upstream in a background thread on 127.0.0.1 (port 0); returns once it serves."""
    sock = _bound()
    port = sock.getsockname()[1]
    server = _Server(_config(build_app(counter, misbehave, stateless=stateless, json_response=json_response)))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failure.append(exc)
            server.ready.set()

    thread = threading.Thread(target=run, name=f"upstream-http-{port}", daemon=True)
    thread.start()
    if not server.ready.wait(start_timeout) or failure or not server.started:
        server.should_exit = True
        thread.join(start_timeout)
        sock.close()
        raise RuntimeError(f"the test upstream did not start on 127.0.0.1:{port}: {failure or 'timed out'}")

    def close() -> None:
        server.should_exit = True
        thread.join()
        sock.close()

    return Served(f"http://127.0.0.1:{port}{PATH}", close)


def serve_forever(counter: Path, misbehave: str | None, *, port: int = 0) -> None:
    """Serve in the foreground (``upstream.py --transport http``); prints the URL once listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    server = _Server(_config(build_app(counter, misbehave)))

    def announce() -> None:
        server.ready.wait()
        if server.started:
            print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}{PATH}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])
