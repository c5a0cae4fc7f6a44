"""``ctrlrun gateway`` over streamable HTTP: serves ``/mcp`` and relays to one upstream URL.

Every ``tools/call`` goes to the interceptor, forwarded over a connection of its own; everything
else is relayed as one upstream request. Requests are checked before the body (Origin, Host,
size), then strictly parsed; the upstream only ever gets the gateway's own serialization.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import urlsplit

from ..action import Principal
from ..operator.text import safe
from ..errors import InvalidArgument, MissingDependency, UsageError
from . import httpinbound, wire
from .httpinbound import Out, Watch, read_chunked
from .config import GatewayConfig
from .intercept import Interceptor
from .outcome import Cancelled, NeverConnected, Observation
from .tools import Catalog

try:
    import httpx2

    from .httpupstream import Event, Exchange, Unreadable, Upstream, forward_call, format_event, media_type, read_body, read_events
except ImportError as missing:  # pragma: no cover - the extra is part of the dev install
    raise MissingDependency(module=missing.name or "httpx2", extra="mcp") from missing

__all__ = ["ListenError", "Listening", "serve_http"]

#: How many relayed request ids are remembered, to route an answer arriving on another stream.
REMEMBERED_IDS = 4096

_KEPT_ANSWER_HEADERS = ("Mcp-Session-Id", "MCP-Protocol-Version")


class ListenError(UsageError):
    """The gateway could not bind its ``--listen`` address."""


@dataclass(frozen=True)
class Listening:
    """A serving gateway: the bound address, and ``close()`` to stop it and wait for it."""

    host: str
    port: int
    close: Callable[[], None]


def serve_http(config: GatewayConfig, interceptor: Interceptor, catalog: Catalog, *, log: TextIO | None = None) -> Listening:
    """Bind ``config.listen`` (port 0 picks one) and serve ``/mcp`` in a background thread."""
    if config.listen is None:
        raise InvalidArgument("serve_http needs config.listen (HOST, PORT)")
    gateway = _Gateway(config, interceptor, catalog, log)
    host, port = config.listen
    kind = _Server6 if ":" in host else _Server
    try:
        server = kind((host, port), _Handler)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --listen address, "
                          "or stop what holds this one") from exc  # fmt: skip
    server.gateway = gateway
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    gateway.bound(host, bound_host, bound_port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="ctrlrun-gateway-http", daemon=True)
    thread.start()
    stopped = threading.Lock()

    def close() -> None:
        if not stopped.acquire(blocking=False):
            return
        server.shutdown()
        gateway.abort_all()
        server.server_close()
        thread.join()

    return Listening(bound_host, bound_port, close)


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close joins the handlers (after close() aborted their I/O)
    gateway: _Gateway

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets its connection is routine; anything else is logged (escaped)."""
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionError, TimeoutError)):
            self.gateway.log(f"a connection from {client_address[0]} failed: {type(error).__name__}: {error}")


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    """One client connection; each request goes to the gateway."""

    protocol_version = "HTTP/1.1"
    server_version = "ctrlrun-gateway"
    sys_version = ""
    server: _Server
    admitted = False

    def setup(self) -> None:
        super().setup()
        self.server.gateway.connection(self.connection, True)

    def finish(self) -> None:
        self.server.gateway.connection(self.connection, False)
        super().finish()

    def parse_request(self) -> bool:
        self.admitted = False
        return super().parse_request()

    def handle_expect_100(self) -> bool:
        return self.server.gateway.expect(self)

    def do_POST(self) -> None:
        self.server.gateway.handle(self, "POST")

    def do_GET(self) -> None:
        self.server.gateway.handle(self, "GET")

    def do_DELETE(self) -> None:
        self.server.gateway.handle(self, "DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # refusals and failures are logged by the gateway, escaped

    def log_error(self, format: str, *args: Any) -> None:
        self.server.gateway.log(f"HTTP error from {self.client_address[0]}: {format % args}")


class _Call:
    """One intercepted ``tools/call`` and the client request it answers."""

    def __init__(self, gateway: _Gateway, out: Out) -> None:
        self._gateway = gateway
        self.out = out
        self.lock = threading.Lock()
        self.over = threading.Event()  # answered, or the interceptor returned
        self.replied = self.cancelled = self.closed = False
        self.exchange: Exchange | None = None
        self.headers: list[tuple[str, str]] = []
        self.final_event_id: str | None = None

    def cancel(self, why: str) -> None:
        with self.lock:
            if self.replied or self.closed or self.cancelled:
                return
            self.cancelled = True
            exchange = self.exchange
        self._gateway.log(f"a tools/call was cancelled: {why}")
        if exchange is not None:
            exchange.abort()

    def reply(self, message: dict[str, Any]) -> None:
        with self.lock:
            drop = self.replied or self.cancelled or self.closed
            self.replied = self.replied or not drop
        if drop:
            self._gateway.log(f"an answer to a cancelled or finished tools/call was dropped (id {message.get('id')!r})")
            return
        if self.out.streaming:
            self.out.event(format_event(Event(id=self.final_event_id), wire.dumps(message).decode("utf-8")))
            self.out.end()
        else:
            self.out.json(200, message, self.headers)
        self.over.set()

    def close(self) -> None:
        """The request is over: end its answer cleanly if nothing answered it."""
        with self.lock:
            self.closed = True
            replied = self.replied
        if not replied:
            self.out.end()


class _Refused(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class _Gateway:
    """The relay's state: upstream link, in-flight calls, remembered ids, live connections."""

    def __init__(self, config: GatewayConfig, interceptor: Interceptor, catalog: Catalog, log: TextIO | None) -> None:
        self.config = config
        self.interceptor = interceptor
        self.catalog = catalog
        self.upstream = Upstream(config)
        self._log = log
        self._log_lock = threading.Lock()
        self._lock = threading.Lock()
        self._calls: dict[tuple[str | None, Any], _Call] = {}
        self._methods: OrderedDict[tuple[str | None, Any], str] = OrderedDict()
        self._exchanges: set[Exchange] = set()
        self._connections: set[socket.socket] = set()
        self._hosts: frozenset[str] = frozenset()
        self._origins = frozenset(origin.strip().lower() for origin in config.allow_origins)

    # -- bookkeeping ---------------------------------------------------------------------------

    def bound(self, configured: str, host: str, port: int) -> None:
        names = {"localhost", configured.lower(), host.lower()}
        shown = {f"[{name}]" if ":" in name else name for name in names}
        allowed = {*shown, *(f"{name}:{port}" for name in shown), *(h.strip().lower() for h in self.config.allow_hosts)}
        self._hosts = frozenset(allowed)

    def log(self, text: str) -> None:
        if self._log is None:
            return
        with self._log_lock:
            try:
                self._log.write(f"ctrlrun gateway: {_clean(text)}\n")
                self._log.flush()
            except (OSError, ValueError):
                pass

    def connection(self, sock: socket.socket, live: bool) -> None:
        with self._lock:
            (self._connections.add if live else self._connections.discard)(sock)

    def _track(self, exchange: Exchange, live: bool) -> None:
        with self._lock:
            (self._exchanges.add if live else self._exchanges.discard)(exchange)

    def abort_all(self) -> None:
        """Shut every upstream exchange and client connection, so the handlers finish."""
        with self._lock:
            exchanges, connections = list(self._exchanges), list(self._connections)
        for exchange in exchanges:
            exchange.abort()
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _remember(self, key: tuple[str | None, Any], method: str) -> None:
        with self._lock:
            self._methods[key] = method
            self._methods.move_to_end(key)
            while len(self._methods) > REMEMBERED_IDS:
                self._methods.popitem(last=False)

    # -- before the body -----------------------------------------------------------------------

    def _admit(self, h: _Handler) -> bool:
        if h.admitted:
            return True
        try:
            origins = h.headers.get_all("Origin") or []
            if origins and (len(origins) > 1 or origins[0].strip().lower() not in self._origins):
                raise _Refused(403, f"Origin {origins[0]!r} is not allowed (--allow-origin)")
            hosts = h.headers.get_all("Host") or []
            if len(hosts) != 1 or hosts[0].strip().lower() not in self._hosts:
                raise _Refused(403, f"Host {hosts[0] if hosts else None!r} is not this gateway's address (--allow-host)")
            if urlsplit(h.path).path != "/mcp":
                raise _Refused(404, f"path {h.path!r} is not served (the endpoint is /mcp)")
        except _Refused as refused:
            self.log(f"refused {h.command} from {h.client_address[0]}: {refused}")
            Out(h).plain(refused.status, close=True)
            return False
        h.admitted = True
        return True

    def expect(self, h: _Handler) -> bool:
        """``Expect: 100-continue``: refuse before the client sends its body, or invite it."""
        if not self._admit(h):
            return False
        length = h.headers.get("Content-Length", "").strip()
        if length.isdigit() and int(length) > self.config.max_message_bytes:
            self.log(f"refused a {length}-byte message from {h.client_address[0]} (--max-message-bytes)")
            Out(h).plain(413, close=True)
            return False
        h.send_response_only(100)
        h.end_headers()
        return True

    def _body(self, h: _Handler, out: Out) -> bytes | None:
        limit = self.config.max_message_bytes
        lengths = h.headers.get_all("Content-Length") or []
        chunked = h.headers.get_all("Transfer-Encoding") or []
        try:
            if chunked:
                if lengths or [value.strip().lower() for value in chunked] != ["chunked"]:
                    raise ValueError("unsupported Transfer-Encoding")
                body = read_chunked(h.rfile, limit)
            else:
                if len(set(lengths)) != 1 or not lengths[0].strip().isdigit():
                    raise _Refused(411 if not lengths else 400, "a POST needs one Content-Length")
                size = int(lengths[0])
                body = None if size > limit else h.rfile.read(size)
                if body is not None and len(body) < size:
                    raise ValueError("the body ended early")
        except (ValueError, OSError) as exc:
            self.log(f"refused a malformed body from {h.client_address[0]}: {exc}")
            out.plain(400, close=True)
            return None
        except _Refused as refused:
            out.plain(refused.status, close=True)
            return None
        if body is None:
            self.log(f"refused a message over {limit} bytes from {h.client_address[0]} (--max-message-bytes)")
            out.plain(413, close=True)
        return body

    # -- requests ------------------------------------------------------------------------------

    def handle(self, h: _Handler, method: str) -> None:
        out = Out(h)
        try:
            if not self._admit(h):
                return
            message = None
            if method == "POST":
                body = self._body(h, out)
                if body is None:
                    return
                message = wire.parse_message(body)
            elif h.headers.get("Content-Length", "0").strip() not in ("", "0") or h.headers.get("Transfer-Encoding"):
                h.close_connection = True  # a GET or DELETE body is not read
            revision = httpinbound.check(h.headers, message, self.catalog.schema)
            if message is not None and wire.kind(message) == "request" and message["method"] == "tools/call":
                self._call(h, out, message, revision)
            else:
                self._relay(h, out, method, message)
        except wire.WireError as refused:
            self.log(f"refused {method} from {h.client_address[0]}: {refused.message}")
            out.json(400, refused.answer())
        except Exception as exc:
            self.log(f"failed {method} from {h.client_address[0]}: {type(exc).__name__}: {exc}")
            h.close_connection = True
            out.plain(502)

    # -- tools/call ----------------------------------------------------------------------------

    def _call(self, h: _Handler, out: Out, message: dict[str, Any], revision: str) -> None:
        key = (httpinbound.one(h.headers, "Mcp-Session-Id"), message["id"])
        call = _Call(self, out)
        with self._lock:
            busy = key in self._calls
            if not busy:
                self._calls[key] = call
        if busy:
            raise wire.WireError(wire.INVALID_REQUEST, "Invalid Request: a tools/call with this id is in flight; use a new id",
                                 id=message["id"])  # fmt: skip
        self._remember(key, "tools/call")
        principal = httpinbound.principal(h.headers, self.config)
        headers = httpinbound.forwarded(h.headers, "POST", self.config)
        watch = Watch(h.connection, lambda: call.cancel("the client closed its connection"))
        worker = threading.Thread(target=self._run_call, args=(call, message, principal, revision, headers),
                                  name="ctrlrun-gateway-call", daemon=True)  # fmt: skip
        worker.start()
        try:
            call.over.wait()
        finally:
            watch.stop()
            with self._lock:
                if self._calls.get(key) is call:
                    del self._calls[key]
            call.close()

    def _run_call(self, call: _Call, message: dict[str, Any], principal: Principal | str | None, revision: str,
                  headers: list[tuple[str, str]]) -> None:  # fmt: skip
        try:
            self.interceptor.call(message, principal=principal, revision=revision,
                                  forward=lambda request: self._forward(call, request, headers), reply=call.reply)  # fmt: skip
        except Exception as exc:
            self.log(f"the interceptor failed on a tools/call: {type(exc).__name__}: {exc}")
            call.reply(wire.error(message["id"], wire.INTERNAL_ERROR, "ctrlrun gateway failed while handling this call; "
                                  "whether the tool ran is unknown: check `ctrlrun effects` before repeating it"))  # fmt: skip
        finally:
            call.over.set()

    def _forward(self, call: _Call, request: dict[str, Any], headers: list[tuple[str, str]]) -> Observation:
        with call.lock:
            if call.cancelled or call.closed:
                return NeverConnected("the client cancelled the call before it was forwarded; nothing was sent")
            exchange = call.exchange = self.upstream.open()
        self._track(exchange, True)
        try:
            observation = forward_call(exchange, request, headers, lambda event, message: self._call_event(call, exchange, event, message))
        finally:
            self._track(exchange, False)
            exchange.close()
        with call.lock:
            call.exchange = None
            call.final_event_id = exchange.final_event_id
            call.headers = _kept(exchange.response)
            if call.cancelled:
                return Cancelled()
        return observation

    def _call_event(self, call: _Call, exchange: Exchange, event: Event, message: dict[str, Any] | None) -> bool:
        data = event.data
        if message is not None:
            if wire.kind(message) == "notification":
                self.catalog.relay_notification(message)
            data = wire.dumps(message).decode("utf-8")
        with call.lock:
            if call.cancelled or call.replied or call.closed:
                return False
        call.out.stream(_kept(exchange.response))
        if call.out.event(format_event(event, data)):
            return True
        call.cancel("the client closed its connection while its call streamed")
        return False

    def _cancel(self, session: str | None, params: Any) -> None:
        ident = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(ident, bool) or not isinstance(ident, (str, int)):
            return
        with self._lock:
            call = self._calls.get((session, ident))
        if call is not None:
            call.cancel(f"notifications/cancelled for request {ident!r}")

    # -- everything else -----------------------------------------------------------------------

    def _relay(self, h: _Handler, out: Out, method: str, message: dict[str, Any] | None) -> None:
        session = httpinbound.one(h.headers, "Mcp-Session-Id")
        ident: Any = None
        asked: str | None = None
        if message is not None:
            kind = wire.kind(message)
            if kind == "notification" and message.get("method") == "notifications/cancelled":
                self._cancel(session, message.get("params"))
            if kind == "request":
                ident, asked = message["id"], message["method"]
                self._remember((session, ident), message["method"])
        exchange = self.upstream.open()
        self._track(exchange, True)
        watch = Watch(h.connection, lambda: _left(out, exchange))
        try:
            what = asked or (message.get("method") if message is not None else None) or method
            try:
                body = wire.dumps(message) if message is not None else None
                response = exchange.send(exchange.build(method, httpinbound.forwarded(h.headers, method, self.config), body, idle=method == "GET" or asked == "subscriptions/listen"))
            except Exception as exc:
                self.log(f"the upstream failed a relayed {what}: {type(exc).__name__}: {exc}")
                out.plain(502)
                return
            try:
                self._answer(out, response, session, ident, asked, what)
            finally:
                response.close()
        finally:
            watch.stop()
            self._track(exchange, False)
            exchange.close()

    def _answer(self, out: Out, response: httpx2.Response, session: str | None, ident: Any, asked: str | None, what: str) -> None:
        status, kept = response.status_code, _kept(response)
        if status == 401 or (status == 403 and "www-authenticate" in response.headers):
            self.log(f"the upstream answered a relayed {what} with HTTP {status} and a challenge; not relayed "
                     "(the gateway authenticates upstream itself: --upstream-header)")  # fmt: skip
            out.plain(502)
            return
        if 200 <= status < 300 and media_type(response) == "text/event-stream":
            self._stream(out, response, kept, session, ident, asked, what)
            return
        try:
            body = read_body(response)
            message = wire.parse_message(body) if body.strip() else None
        except (Unreadable, wire.WireError, httpx2.HTTPError) as exc:
            self.log(f"the upstream's answer to a relayed {what} (HTTP {status}) is not readable: {exc}")
            out.plain(502 if 200 <= status < 300 else status, kept)
            return
        if message is None:
            out.plain(status, kept)
            return
        relayed = self._inbound(message, session, ident, asked)
        if relayed is None:
            out.plain(502)
            return
        out.json(status, relayed, kept)

    def _stream(self, out: Out, response: httpx2.Response, kept: list[tuple[str, str]], session: str | None,
                ident: Any, asked: str | None, what: str) -> None:  # fmt: skip
        out.stream(kept)
        try:
            for event in read_events(response.iter_bytes()):
                data, message = event.data, None
                if data:
                    message = self._inbound(wire.parse_message(data), session, ident, asked)
                    if message is None:
                        continue
                    data = wire.dumps(message).decode("utf-8")
                if not out.event(format_event(event, data)):
                    return
                if message is not None and ident is not None and _answers(message, ident):
                    break  # the request's own stream ends with its answer
        except Exception as exc:
            if out.gone:
                return  # the client left, and its upstream stream was shut
            self.log(f"the upstream's event stream for a relayed {what} broke off: {type(exc).__name__}: {exc}")
        out.end()

    def _inbound(self, message: dict[str, Any], session: str | None, ident: Any, asked: str | None) -> dict[str, Any] | None:
        """An upstream message as the client gets it (``None``: dropped)."""
        kind = wire.kind(message)
        if kind == "notification":
            self.catalog.relay_notification(message)
            return message
        if kind != "response":
            return message
        got = message.get("id")
        if ident is not None and _answers(message, ident):
            return self.catalog.relay_result(asked, message)
        with self._lock:
            method = self._methods.get((session, got))
        if method == "tools/call":
            self.log(f"dropped an answer to tools/call {got!r} that came outside its own stream")
            return None
        return self.catalog.relay_result(method, message)


# -- helpers ---------------------------------------------------------------------------------


def _left(out: Out, exchange: Exchange) -> None:
    out.gone = True
    exchange.abort()


def _answers(message: dict[str, Any], ident: Any) -> bool:
    got = message.get("id")
    return wire.kind(message) == "response" and type(got) is type(ident) and got == ident


def _kept(response: httpx2.Response | None) -> list[tuple[str, str]]:
    if response is None:
        return []
    return [(name, response.headers[name]) for name in _KEPT_ANSWER_HEADERS if name in response.headers]


def _clean(text: str, limit: int = 600) -> str:
    """``text`` escaped as the CLI escapes it (control, format, separator characters), cut to
    ``limit`` characters."""
    return safe(text if len(text) <= limit else text[:limit] + "...")
