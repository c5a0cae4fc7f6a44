"""The gateway's upstream link over streamable HTTP: one fresh httpx2 connection per exchange
(so "never connected" is provable), abortable from any thread, and a strict SSE reader.

An intercepted call's exchange ends in one ``Observation``; nothing the upstream says is
trusted beyond what the bytes on the call's own connection show.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore2
import httpx2

from ..transport import Transport
from . import wire
from .config import MIB, GatewayConfig
from .outcome import Answered, Broken, Cancelled, Challenged, NeverConnected, Observation

__all__ = [
    "UPSTREAM_LIMIT",
    "Event",
    "Exchange",
    "Unreadable",
    "Upstream",
    "forward_call",
    "format_event",
    "media_type",
    "read_body",
    "read_events",
]

#: The most the gateway reads of one upstream answer or SSE event.
UPSTREAM_LIMIT = 64 * MIB

_LINE_END = re.compile(rb"[\r\n]")
_BOM = b"\xef\xbb\xbf"


class Unreadable(Exception):
    """The upstream's bytes are not what streamable HTTP allows (not UTF-8, too large)."""


@dataclass(frozen=True)
class Event:
    """One SSE event as the upstream sent it; ``None`` for a field this event did not carry."""

    data: str | None = None
    id: str | None = None
    event: str | None = None
    retry: int | None = None


def read_events(chunks: Iterable[bytes], limit: int = UPSTREAM_LIMIT) -> Iterator[Event]:
    """The events of an SSE body, each line decoded as strict UTF-8; an event not closed by a
    blank line before the body ends is not an event. Raises ``Unreadable``."""
    reader = _Reader(limit)
    for chunk in chunks:
        yield from reader.feed(chunk, final=False)
    yield from reader.feed(b"", final=True)


class _Reader:
    """SSE's line and field rules over bytes (CR, LF or CRLF line ends; a leading BOM)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = bytearray()
        self._fields: dict[str, Any] = {}
        self._data: list[str] = []
        self._size = 0
        self._first = True

    def feed(self, chunk: bytes, *, final: bool) -> Iterator[Event]:
        pending = self._pending
        pending += chunk
        while (found := _LINE_END.search(pending)) is not None:
            end = found.start()
            if pending[end] == 0x0D and end + 1 == len(pending) and not final:
                break  # a CR at the end of the chunk may be the first half of CRLF
            line = bytes(pending[:end])
            del pending[: end + (2 if pending[end : end + 2] == b"\r\n" else 1)]
            if self._first:
                line, self._first = line.removeprefix(_BOM), False
            if line:
                self._size += len(line)
                if self._size > self._limit:
                    raise Unreadable(f"an SSE event is larger than {self._limit} bytes")
                _field(_text(line), self._fields, self._data)
            elif self._fields or self._data:
                yield Event(data="\n".join(self._data) if self._data else None, **self._fields)
                self._fields, self._data, self._size = {}, [], 0
        if len(pending) > self._limit:
            raise Unreadable(f"an SSE line is longer than {self._limit} bytes")


def _text(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("an SSE line is not UTF-8") from None


def _field(line: str, fields: dict[str, Any], data: list[str]) -> None:
    if line.startswith(":"):
        return
    name, _, value = line.partition(":")
    value = value[1:] if value.startswith(" ") else value
    if name == "data":
        data.append(value)
    elif name == "id" and "\0" not in value:
        fields["id"] = value
    elif name == "event":
        fields["event"] = value
    elif name == "retry" and value.isascii() and value.isdigit():
        fields["retry"] = int(value)


def format_event(event: Event, data: str | None) -> bytes:
    """One SSE event for the client: ``event``'s id, type and retry, and ``data`` (our own
    serialization of its message, or the upstream's data when it carried no message)."""
    lines = []
    if event.id is not None:
        lines.append(f"id: {event.id}")
    if event.event is not None:
        lines.append(f"event: {event.event}")
    if event.retry is not None:
        lines.append(f"retry: {event.retry}")
    if data is not None:
        lines.extend(f"data: {part}" for part in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def media_type(response: httpx2.Response) -> str:
    """The response's Content-Type without parameters, lower-cased."""
    return response.headers.get("content-type", "").partition(";")[0].strip().lower()


def read_body(response: httpx2.Response, limit: int = UPSTREAM_LIMIT) -> bytes:
    """The whole (decoded) body, at most ``limit`` bytes; else ``Unreadable``."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise Unreadable(f"the upstream's answer is larger than {limit} bytes")
    return bytes(body)


class _Stream(httpcore2.NetworkStream):
    """A connection's stream that its exchange can shut down from another thread."""

    def __init__(self, inner: httpcore2.NetworkStream, owner: _Backend) -> None:
        self._inner = inner
        self._owner = owner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        return self._owner.adopt(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.NetworkBackend):
    """httpcore2's sync backend, remembering every socket it opens so ``abort`` can shut them."""

    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()
        self._lock = threading.Lock()
        self._streams: list[httpcore2.NetworkStream] = []
        self._aborted = False

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:  # fmt: skip
        return self.adopt(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        raise httpcore2.ConnectError("the gateway's upstream is an http(s) URL, not a unix socket")

    def adopt(self, stream: httpcore2.NetworkStream) -> httpcore2.NetworkStream:
        with self._lock:
            self._streams.append(stream)
            aborted = self._aborted
        if aborted:
            _shut(stream)
        return _Stream(stream, self)

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            streams = list(self._streams)
        for stream in streams:
            _shut(stream)


def _shut(stream: httpcore2.NetworkStream) -> None:
    """Shut the socket both ways, which wakes a thread blocked reading it (a close would not)."""
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


class _Transport(httpx2.HTTPTransport):
    """httpx2's transport over one connection of a ``_Backend`` (no retries, HTTP/1.1)."""

    def __init__(self, context: ssl.SSLContext, backend: _Backend) -> None:
        super().__init__(verify=context, trust_env=False, retries=0)
        self._pool = httpcore2.ConnectionPool(
            ssl_context=context, max_connections=1, http1=True, http2=False, retries=0, network_backend=backend
        )


class Upstream:
    """Where and how the gateway reaches its one upstream: URL, TLS trust, timeouts, headers."""

    def __init__(self, config: GatewayConfig) -> None:
        if config.upstream_url is None:
            raise ValueError("the http gateway needs config.upstream_url")
        self.url = config.upstream_url
        self.timeout = config.upstream_timeout
        self.headers = tuple(config.upstream_headers)
        if config.upstream_ca_file is not None:
            self._context = ssl.create_default_context(cafile=config.upstream_ca_file)
        else:
            self._context = httpx2.create_ssl_context(verify=True, trust_env=False)

    def open(self) -> Exchange:
        """A new exchange over a connection of its own."""
        return Exchange(self, self._context)


class Exchange:
    """One upstream HTTP request over its own new connection. ``abort()`` may be called from any
    thread: it shuts the connection, so a blocked read or write fails at once."""

    def __init__(self, upstream: Upstream, context: ssl.SSLContext) -> None:
        self._upstream = upstream
        self._backend = _Backend()
        self._client = httpx2.Client(
            transport=_Transport(context, self._backend), trust_env=False, follow_redirects=False,
            timeout=httpx2.Timeout(upstream.timeout),
        )  # fmt: skip
        self.final_event_id: str | None = None
        self.response: httpx2.Response | None = None

    def build(self, method: str, headers: list[tuple[str, str]], body: bytes | None, *, idle: bool = False) -> httpx2.Request:
        """The request (nothing is sent); ``idle``: no read timeout (a GET's event stream may stay
        quiet for long)."""
        timeout = httpx2.Timeout(self._upstream.timeout, read=None) if idle else httpx2.Timeout(self._upstream.timeout)
        return self._client.build_request(
            method, self._upstream.url, headers=[*headers, *self._upstream.headers], content=body, timeout=timeout
        )

    def send(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request``; the response's body is left unread (``self.response``)."""
        self.response = self._client.send(request, stream=True)
        return self.response

    def abort(self) -> None:
        """Shut the connection (from any thread)."""
        self._backend.abort()

    def close(self) -> None:
        """Release the connection."""
        self._client.close()


#: Relays one event of a call's stream to the client (``message``: its parsed JSON-RPC message,
#: ``None`` for an event without data); answers ``False`` when the client is gone.
RelayEvent = Callable[[Event, dict[str, Any] | None], bool]


def forward_call(
    exchange: Exchange, request: dict[str, Any], headers: list[tuple[str, str]], relay: RelayEvent
) -> Observation:
    """POST one intercepted ``tools/call`` and say what was observed of it."""
    try:
        built = exchange.build("POST", headers, wire.dumps(request))
    except Exception as exc:
        return NeverConnected(f"the request could not be built, nothing was sent ({_name(exc)})")
    try:
        response = exchange.send(built)
    except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
        return NeverConnected(f"the upstream connection was never established ({_name(exc)})")
    except httpx2.TimeoutException as exc:
        return Broken(Transport.AFTER_REQUEST_SENT, f"the upstream did not answer within the timeout ({_name(exc)})")
    except Exception as exc:
        return Broken(Transport.AFTER_REQUEST_SENT, f"the upstream connection failed after connecting ({_name(exc)})")
    streaming = 200 <= response.status_code < 300 and media_type(response) == "text/event-stream"
    try:
        if streaming:
            return _call_stream(exchange, response, request.get("id"), relay)
        return _call_answer(response, read_body(response), request.get("id"))
    except Unreadable as exc:
        return Broken(Transport.UNREADABLE_RESPONSE, str(exc))
    except httpx2.TimeoutException as exc:
        return Broken(Transport.AFTER_REQUEST_SENT, f"the upstream stopped answering within the timeout ({_name(exc)})")
    except Exception as exc:
        if streaming:
            return Broken(Transport.STREAM_ENDED_EARLY, f"the upstream's event stream broke off ({_name(exc)})")
        return Broken(Transport.AFTER_REQUEST_SENT, f"the upstream's answer broke off ({_name(exc)})")
    finally:
        response.close()


def _call_answer(response: httpx2.Response, body: bytes, request_id: Any) -> Observation:
    status = response.status_code
    try:
        message = wire.parse_message(body) if body.strip() else None
    except wire.WireError:
        message = None
    if message is not None and wire.kind(message) == "response":
        if _same_id(message.get("id"), request_id):
            return Answered(message)
        return Broken(Transport.UNREADABLE_RESPONSE, "the upstream answered another request id")
    if status == 401 or (status == 403 and "www-authenticate" in response.headers):
        return Challenged(status)
    what = "a body that is not a strict JSON-RPC response" if body.strip() else "no body"
    return Broken(Transport.UNREADABLE_RESPONSE, f"the upstream answered HTTP {status} with {what}")


def _call_stream(exchange: Exchange, response: httpx2.Response, request_id: Any, relay: RelayEvent) -> Observation:
    for event in read_events(response.iter_bytes()):
        if not event.data:
            if not relay(event, None):
                return Cancelled("the client closed its connection")
            continue
        try:
            message = wire.parse_message(event.data)
        except wire.WireError:
            return Broken(Transport.UNREADABLE_RESPONSE, "an event of the upstream's stream is not a strict JSON-RPC message")
        if wire.kind(message) == "response":
            if not _same_id(message.get("id"), request_id):
                return Broken(Transport.UNREADABLE_RESPONSE, "the upstream's stream answered another request id")
            exchange.final_event_id = event.id
            return Answered(message)
        if not relay(event, message):
            return Cancelled("the client closed its connection")
    return Broken(Transport.STREAM_ENDED_EARLY, "the upstream's event stream ended before its answer")


def _same_id(got: Any, want: Any) -> bool:
    return type(got) is type(want) and got == want


def _name(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
