"""The client's side of one HTTP exchange: what its request headers say, checked against the
body (revision, mirrored ``Mcp-*`` headers, identity), which go upstream, reading a chunked
body, writing the answer (JSON or SSE), and noticing the client leave. Decisions always come
from the body.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import Any

from ..action import Principal
from ..errors import InvalidArgument
from . import wire
from .config import GatewayConfig

__all__ = ["DEFAULT_REVISION", "NAME_PARAMS", "Out", "Watch", "check", "forwarded", "one", "principal", "read_chunked"]

#: The revision of a request that sends no ``MCP-Protocol-Version`` header.
DEFAULT_REVISION = "2025-03-26"
#: Methods whose ``Mcp-Name`` header mirrors one of their params.
NAME_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

_SENTINEL = re.compile(r"=\?base64\?(.*)\?=")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")
_ONE_SCHEMA = frozenset({"items", "contains", "unevaluatedItems", "additionalProperties", "propertyNames",
                         "unevaluatedProperties", "not", "if", "then", "else", "contentSchema"})  # fmt: skip
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})

Schema = Callable[[str], "dict[str, Any] | None"]


def one(headers: Message, name: str) -> str | None:
    """The header's (first) value without surrounding blanks, or ``None``."""
    values = headers.get_all(name)
    return str(values[0]).strip(" \t") if values else None


def check(headers: Message, message: dict[str, Any] | None, schema: Schema) -> str:
    """The request's revision, once its headers agree with its body; else ``WireError``
    (``-32022`` for an unserved revision, ``-32020`` for a disagreeing or repeated header)."""
    ident = message.get("id") if message is not None and wire.kind(message) == "request" else None
    seen: set[str] = set()
    for name, value in headers.items():
        low = name.lower()
        if low.startswith("mcp-") and low in seen:
            raise _mismatch(ident, f"the {name} header was sent more than once; send it once")
        seen.add(low)
        if (low.startswith("mcp-") or low in ("accept", "last-event-id")) and not _PRINTABLE.fullmatch(str(value)):
            raise wire.WireError(wire.INVALID_REQUEST, f"Invalid Request: the {name} header is not printable ASCII", id=ident)
    header = one(headers, "MCP-Protocol-Version")
    revision = wire.revision_of(message or {}, header or DEFAULT_REVISION)
    if revision not in wire.HTTP_REVISIONS:
        shown = str(revision)[:64]
        raise wire.WireError(wire.UNSUPPORTED_REVISION, f"Unsupported protocol version {shown!r}: this gateway serves "
                             f"{', '.join(wire.HTTP_REVISIONS)} over HTTP", id=ident,
                             data={"supported": list(wire.HTTP_REVISIONS), "requested": shown})  # fmt: skip
    if message is not None:
        _agree(headers, message, revision, header, ident, schema)
    return revision


def _agree(headers: Message, message: dict[str, Any], revision: str, header: str | None, ident: Any, schema: Schema) -> None:
    modern = revision == wire.ENVELOPE_REVISION
    request = wire.kind(message) == "request"
    envelope = wire.revision_of(message, None)
    if envelope is not None and header != envelope and (header is not None or modern):
        raise _mismatch(ident, "the MCP-Protocol-Version header does not match the message's protocol version")
    method = message.get("method")
    sent = one(headers, "Mcp-Method")
    if sent is not None and sent != method:
        raise _mismatch(ident, "the Mcp-Method header does not match the body's method")
    if sent is None and modern and request:
        raise _mismatch(ident, f"the Mcp-Method header must be sent on {revision}")
    raw = message.get("params")
    params: dict[str, Any] = raw if isinstance(raw, dict) else {}
    key = NAME_PARAMS.get(method) if isinstance(method, str) else None
    if key is not None:
        value, named = params.get(key), one(headers, "Mcp-Name")
        if named is not None and _decoded(named) != value:
            raise _mismatch(ident, f"the Mcp-Name header does not match the body's {key!r}")
        if named is None and modern and request and isinstance(value, str):
            raise _mismatch(ident, f"the Mcp-Name header must be sent on {revision} ({method} {key!r})")
    if method == "tools/call" and request and isinstance(params.get("name"), str):
        _param_headers(headers, params, modern, ident, schema(params["name"]))


def _param_headers(headers: Message, params: dict[str, Any], modern: bool, ident: Any, schema: Any) -> None:
    raw = params.get("arguments")
    arguments: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for path, token, kind in _annotations(schema) or ():
        name, shown = f"Mcp-Param-{token}", ".".join(path)
        sent, value = one(headers, name), _at(arguments, path)
        rendered = _rendered(value)
        if rendered is None:
            if sent is not None:
                raise _mismatch(ident, f"the {name} header is sent but argument {shown!r} is absent or not a scalar")
            continue
        if sent is None:
            if modern:
                raise _mismatch(ident, f"the {name} header is missing but argument {shown!r} is present")
            continue
        decoded = _decoded(sent)
        if decoded is None or not _matches(kind, value, rendered, decoded):
            raise _mismatch(ident, f"the {name} header does not match argument {shown!r}")


def principal(headers: Message, config: GatewayConfig) -> Principal | str | None:
    """The configured principal, or the identity headers' (blank or absent: ``None``); a string
    saying why none is usable when a header was sent more than once or holds an unusable value."""
    try:
        if config.principal is not None:
            return Principal(*config.principal)
        if config.principal_header is None:
            return None
        agent = _identity(headers, config.principal_header)
        user = _identity(headers, config.user_header) if config.user_header else None
        return Principal(agent, user) if agent is not None else None
    except _Twice as twice:
        return str(twice)
    except InvalidArgument as exc:
        return f"the principal is not usable: {exc}"


class _Twice(Exception):
    pass


def _identity(headers: Message, name: str) -> str | None:
    values = headers.get_all(name) or []
    if len(values) > 1:
        raise _Twice(f"the {name} header was sent {len(values)} times: the proxy in front of the gateway must set it exactly once")
    return (str(values[0]).strip() or None) if values else None


def forwarded(headers: Message, method: str, config: GatewayConfig) -> list[tuple[str, str]]:
    """The client's headers the upstream gets: ``Mcp-*``, ``Accept``, ``Last-Event-ID``; never
    Host, Origin, Cookie, Authorization, hop-by-hop or identity headers, nor one that an
    ``--upstream-header`` sets."""
    dropped = {name.lower() for name in (config.principal_header, config.user_header) if name}
    dropped |= {name.lower() for name, _ in config.upstream_headers}
    kept = [(name, str(value).strip()) for name, value in headers.items()
            if (name.lower().startswith("mcp-") or name.lower() in ("accept", "last-event-id"))
            and name.lower() not in dropped]  # fmt: skip
    if not any(name.lower() == "accept" for name, _ in kept) and "accept" not in dropped:
        kept.append(("Accept", "application/json, text/event-stream" if method == "POST" else "text/event-stream"))
    if method == "POST":
        kept.append(("Content-Type", "application/json"))
    return kept


def _mismatch(ident: Any, why: str) -> wire.WireError:
    return wire.WireError(wire.HEADER_MISMATCH, f"Header mismatch: {why}", id=ident)


def _decoded(value: str) -> str | None:
    """A mirrored header's value: as sent, or its ``=?base64?...?=`` sentinel decoded
    (``None`` for a malformed one, which matches nothing)."""
    found = _SENTINEL.fullmatch(value)
    if found is None:
        return value
    try:
        raw = base64.b64decode(found[1], validate=True)
        if base64.b64encode(raw).decode("ascii") != found[1]:
            return None
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _annotations(schema: Any) -> list[tuple[tuple[str, ...], str, str]] | None:
    """A tool input schema's ``x-mcp-header`` annotations as (property path, token, type);
    ``None`` when there is no schema or any annotation is invalid (then no header is checked)."""
    if not isinstance(schema, dict):
        return None
    found: list[tuple[tuple[str, ...], str, str]] = []
    tokens: set[str] = set()
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        if "x-mcp-header" in node:
            token, kind = node["x-mcp-header"], node.get("type")
            if not path or not isinstance(token, str) or not _TOKEN.fullmatch(token) or token.lower() in tokens:
                return None
            if not isinstance(kind, str) or kind not in ("string", "integer", "boolean"):
                return None
            tokens.add(token.lower())
            found.append((path, token, kind))
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                stack.extend(((*path, name) if path is not None else None, sub) for name, sub in value.items())
            elif key in _ONE_SCHEMA:
                stack.append((None, value))
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())
    return found


def _at(arguments: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(arguments, dict):
            return None
        arguments = arguments.get(key)
    return arguments


def _rendered(value: Any) -> str | None:
    """How a client mirrors an argument into its header (``None``: it cannot)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, (str, int, float)):
        return None
    try:
        return str(value)
    except ValueError:
        return None


def _matches(kind: str, value: Any, rendered: str, decoded: str) -> bool:
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "integer" and not isinstance(value, bool) and integral and _DECIMAL.fullmatch(decoded):
        whole, _, fraction = decoded.partition(".")
        return not fraction.strip("0") and int(whole) == int(value)
    return decoded == rendered


def read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes | None:
    """A chunked body, ``None`` once it passes ``limit``; ``ValueError`` when malformed."""
    body = bytearray()
    while True:
        line = rfile.readline(1024)
        if not line.endswith(b"\n"):
            raise ValueError("a chunk size line is malformed")
        size = int(line.split(b";")[0].strip(), 16)
        if size < 0:
            raise ValueError("a chunk size is negative")
        if size == 0:
            while rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(body)
        if len(body) + size > limit:
            return None
        chunk = rfile.read(size)
        if len(chunk) < size or rfile.readline(3) not in (b"\r\n", b"\n"):
            raise ValueError("a chunk ended early")
        body += chunk


class Out:
    """The answer to one client request: a body with its length, or a chunked SSE stream."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._h = handler
        self._lock = threading.Lock()
        self.started = False
        self.streaming = False
        self.gone = False

    def plain(self, status: int, headers: Iterable[tuple[str, str]] = (), body: bytes = b"",
              content_type: str | None = None, *, close: bool = False) -> None:  # fmt: skip
        """A whole answer (``close``: the connection ends after it, its body was not read)."""
        with self._lock:
            if self.started or self.gone:
                return
            self.started = True
            extra = [("Content-Type", content_type)] if content_type else []
            extra.append(("Content-Length", str(len(body))))
            if close:
                extra.append(("Connection", "close"))
                self._h.close_connection = True
            self._write(status, [*headers, *extra], body)

    def json(self, status: int, message: dict[str, Any], headers: Iterable[tuple[str, str]] = ()) -> None:
        self.plain(status, headers, wire.dumps(message), "application/json")

    def stream(self, headers: Iterable[tuple[str, str]]) -> None:
        """Start a 200 SSE answer (nothing if an answer was started already)."""
        with self._lock:
            if self.started or self.gone:
                return
            self.started = self.streaming = True
            sse = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked")]
            self._write(200, [*headers, *sse], b"")

    def event(self, data: bytes) -> bool:
        """Send one SSE event; ``False`` when the client is gone."""
        with self._lock:
            if self.gone or not self.streaming:
                return False
            self._send(b"%x\r\n%s\r\n" % (len(data), data))
            return not self.gone

    def end(self) -> None:
        """End the answer cleanly: close the stream, or send an empty one if nothing started."""
        if not self.started:
            self.stream(())
        with self._lock:
            if self.streaming and not self.gone:
                self._send(b"0\r\n\r\n")
            self.streaming = False

    def _write(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        try:
            self._h.send_response(status)
            for name, value in headers:
                self._h.send_header(name, value)
            self._h.end_headers()
        except OSError:
            self._lost()
            return
        if body:
            self._send(body)

    def _send(self, data: bytes) -> None:
        try:
            self._h.wfile.write(data)
            self._h.wfile.flush()
        except OSError:
            self._lost()

    def _lost(self) -> None:
        self.gone = True
        self._h.close_connection = True


class Watch:
    """Calls ``gone`` once if the client closes its connection while its request is served."""

    def __init__(self, sock: socket.socket, gone: Callable[[], None]) -> None:
        self._sock = sock
        self._gone = gone
        self._wake, self._waker = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="ctrlrun-gateway-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            try:
                selector.register(self._sock, selectors.EVENT_READ)
                selector.register(self._wake, selectors.EVENT_READ)
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake in ready or self._sock.recv(1, socket.MSG_PEEK):
                    return  # stopped, or the client sent more (not a close)
            except (OSError, ValueError):
                pass
        self._gone()

    def stop(self) -> None:
        try:
            self._waker.send(b"x")
        except OSError:
            pass
        self._thread.join()
        self._wake.close()
        self._waker.close()
