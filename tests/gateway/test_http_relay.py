"""The streamable-HTTP relay (``ctrlrun.gateway.http``): raw HTTP against ``serve_http`` on
127.0.0.1, a scripted fake upstream, a fake interceptor and a pass-through catalog."""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ctrlrun.action import Principal
from ctrlrun.gateway import wire
from ctrlrun.gateway.config import GatewayConfig
from ctrlrun.gateway.http import Listening, serve_http
from ctrlrun.gateway.outcome import Answered, Broken, Cancelled, Challenged, NeverConnected
from ctrlrun.transport import Transport

from .http_fakes.fakes import FakeInterceptor, PassCatalog
from .http_fakes.scripted import WAIT, FakeUpstream, drop, hold, raw, result_for, sse, with_id

AGENT = [("X-Agent", "agent-1")]
MODERN = wire.ENVELOPE_REVISION


def call(ident: Any = 1, name: str = "refund", arguments: dict[str, Any] | None = None, revision: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments if arguments is not None else {"order": "A-1"}}
    if revision is not None:
        params["_meta"] = {wire.META_REVISION: revision}
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


def event(message: dict[str, Any], ident: str | None = None) -> bytes:
    head = f"id: {ident}\n" if ident is not None else ""
    return f"{head}event: message\ndata: {json.dumps(message)}\n\n".encode()


def final(result: dict[str, Any], ident: str | None = None) -> Callable[[Any], bytes]:
    return lambda request_id: event({"jsonrpc": "2.0", "id": request_id, "result": result}, ident)


PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}


@dataclass
class Running:
    listening: Listening
    interceptor: FakeInterceptor
    catalog: PassCatalog
    log: io.StringIO

    @property
    def port(self) -> int:
        return self.listening.port

    def send(self, body: bytes | dict[str, Any] | None, headers: list[tuple[str, str]] = (), *,  # type: ignore[assignment]
             method: str = "POST", host: str | None = None, path: str = "/mcp") -> http.client.HTTPConnection:  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        for name, value in headers:
            conn.putheader(name, value)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        return conn

    def post(self, body: bytes | dict[str, Any] | None, headers: list[tuple[str, str]] = (), **kw: Any) -> tuple[int, http.client.HTTPMessage, bytes]:  # type: ignore[assignment]
        conn = self.send(body, headers, **kw)
        try:
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        finally:
            conn.close()


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    yield fake
    fake.close()


@pytest.fixture
def gateway_for() -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(url: str, schemas: dict[str, Any] | None = None, **overrides: Any) -> Running:
        settings: dict[str, Any] = {
            "alias": "t", "upstream_url": url, "listen": ("127.0.0.1", 0), "principal_header": "X-Agent",
            "user_header": "X-User", "upstream_headers": (("Authorization", "Bearer upstream-token"),),
            "upstream_timeout": WAIT * 3,
        }  # fmt: skip
        settings.update(overrides)
        interceptor, catalog, log = FakeInterceptor(), PassCatalog(schemas), io.StringIO()
        running = Running(serve_http(GatewayConfig(**settings), interceptor, catalog, log=log), interceptor, catalog, log)
        started.append(running)
        return running

    yield start
    for running in started:
        running.listening.close()


def messages_of(headers: http.client.HTTPMessage, body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer, a JSON body or an SSE stream."""
    if headers.get_content_type() == "text/event-stream":
        return [json.loads(e["data"]) for e in parse_events(body) if e.get("data")]
    return [json.loads(body)] if body else []


def parse_events(body: bytes) -> list[dict[str, str]]:
    events = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
        if fields:
            events.append(fields)
    return events


def next_event(response: http.client.HTTPResponse) -> dict[str, str] | None:
    """Read one SSE event off a live response (``None`` at its end)."""
    fields: dict[str, str] = {}
    while True:
        line = response.readline()
        if not line:
            return None
        text = line.decode().rstrip("\r\n")
        if not text:
            if fields:
                return fields
            continue
        name, _, value = text.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value


# -- before the body ---------------------------------------------------------------------------


def test_a_foreign_origin_is_refused_403_and_an_allowed_one_passes(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, allow_origins=("http://ok.example",))
    status, _, _ = gw.post(call(), [*AGENT, ("Origin", "http://evil.example")])
    assert status == 403
    assert upstream.received == []
    status, _, _ = gw.post(call(), [*AGENT, ("Origin", "http://ok.example")])
    assert status == 200
    assert len(upstream.received) == 1


def test_a_foreign_host_is_refused_403(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, allow_hosts=("gw.internal:8900",))
    for host in ("evil.example", f"evil.example:{gw.port}", f"127.0.0.2:{gw.port}"):
        assert gw.post(call(), AGENT, host=host)[0] == 403, host
    assert upstream.received == []
    for ident, host in enumerate(("127.0.0.1", f"localhost:{gw.port}", "localhost", "gw.internal:8900"), start=1):
        assert gw.post(call(ident), AGENT, host=host)[0] == 200, host
    assert len(upstream.received) == 4


def test_other_paths_are_not_served(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    assert gw.post(call(), AGENT, path="/other")[0] == 404
    assert upstream.received == []


def test_a_body_over_the_limit_is_413_by_length_by_chunks_and_before_100_continue(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, max_message_bytes=300)
    big = json.dumps(call(arguments={"pad": "x" * 400})).encode()
    assert gw.post(big, AGENT)[0] == 413

    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    conn.request("POST", "/mcp", body=iter([big[:200], big[200:]]), headers={"X-Agent": "a"}, encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()

    conn = gw.send(None, [*AGENT, ("Expect", "100-continue"), ("Content-Length", "100000")])
    assert conn.getresponse().status == 413  # answered before any body byte was sent
    conn.close()
    assert upstream.received == []

    small = json.dumps(call()).encode()
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    conn.request("POST", "/mcp", body=iter([small[:10], small[10:]]), headers={"X-Agent": "a"}, encode_chunked=True)
    assert conn.getresponse().status == 200  # a chunked body within the limit is read whole
    conn.close()
    assert upstream.wait_for(1)[0].message() == call()


# -- strict messages, revisions, mirrored headers -------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list"}', wire.PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"a":NaN}}}', wire.PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"} {}', wire.PARSE_ERROR),
        (b'\xff\xfe{"jsonrpc":"2.0"}', wire.PARSE_ERROR),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', wire.INVALID_REQUEST),
        (b'{"jsonrpc":"1.0","id":1,"method":"tools/list"}', wire.INVALID_REQUEST),
    ],
)
def test_non_strict_messages_are_400_and_never_forwarded(upstream: FakeUpstream, gateway_for: Any, body: bytes, code: int) -> None:
    gw = gateway_for(upstream.url)
    status, headers, answer = gw.post(body, AGENT)
    assert status == 400
    assert headers.get_content_type() == "application/json"
    assert json.loads(answer)["error"]["code"] == code
    assert upstream.received == [] and gw.interceptor.seen == []


def test_an_unserved_revision_is_400_minus_32022(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    status, _, body = gw.post(call(), [*AGENT, ("MCP-Protocol-Version", "2024-11-05")])
    assert (status, json.loads(body)["error"]["code"]) == (400, wire.UNSUPPORTED_REVISION)
    status, _, body = gw.post(call(revision="1999-01-01"), AGENT)
    assert (status, json.loads(body)["error"]["code"], json.loads(body)["id"]) == (400, wire.UNSUPPORTED_REVISION, 1)
    assert upstream.received == []
    gw.post(call(), AGENT)  # no header: 2025-03-26
    assert gw.interceptor.settled().revision == "2025-03-26"


REGION_SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"},
                                                  "order": {"type": "string"}}}  # fmt: skip


def modern_headers(**extra: str) -> list[tuple[str, str]]:
    base = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "refund"}
    base.update(extra)
    return [*AGENT, *((k.replace("_", "-"), v) for k, v in base.items())]


@pytest.mark.parametrize(
    ("headers", "modern"),
    [
        ([*AGENT, ("Mcp-Method", "tools/list")], False),  # disagrees, any revision
        ([*AGENT, ("Mcp-Name", "other")], False),
        ([*AGENT, ("Mcp-Method", "tools/call"), ("Mcp-Method", "tools/call")], False),  # repeated
        ([*AGENT, ("Mcp-Param-Region", "us")], False),  # sent: must agree on any revision
        ([(k, v) for k, v in modern_headers() if k != "Mcp-Name"], True),  # required on 2026-07-28
        ([(k, v) for k, v in modern_headers() if k != "Mcp-Method"], True),
        ([(k, v) for k, v in modern_headers() if k != "MCP-Protocol-Version"], True),
        (modern_headers(**{"MCP-Protocol-Version": "2025-11-25"}), True),  # disagrees with the envelope
        (modern_headers(**{"Mcp-Param-Region": "us"}), True),
        (modern_headers(**{"Mcp-Param-Region": "=?base64?dXM=?="}), True),  # "us"
        (modern_headers(**{"Mcp-Param-Region": "=?base64?ZXU?="}), True),  # malformed sentinel
        ([*modern_headers(**{"Mcp-Param-Region": "eu"}), ("Mcp-Param-Region", "eu")], True),
        (modern_headers(), True),  # the annotated argument is present, its header missing
    ],
)
def test_mirrored_headers_that_disagree_are_400_minus_32020(upstream: FakeUpstream, gateway_for: Any,
                                                            headers: list[tuple[str, str]], modern: bool) -> None:  # fmt: skip
    gw = gateway_for(upstream.url, schemas={"refund": REGION_SCHEMA})
    message = call(arguments={"order": "A-1", "region": "eu"}, revision=MODERN if modern else None)
    status, _, body = gw.post(message, headers)
    assert status == 400
    assert json.loads(body)["error"]["code"] == wire.HEADER_MISMATCH
    assert json.loads(body)["id"] == 1
    assert upstream.received == [] and gw.interceptor.seen == []


def test_mirrored_headers_that_agree_pass_base64_sentinel_included(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, schemas={"refund": REGION_SCHEMA})
    message = call(arguments={"order": "A-1", "region": "eu"}, revision=MODERN)
    sentinel = "=?base64?" + base64.b64encode(b"refund").decode() + "?="
    status, _, _ = gw.post(message, modern_headers(**{"Mcp-Name": sentinel, "Mcp-Param-Region": "eu"}))
    assert status == 200
    assert gw.interceptor.settled().revision == MODERN
    got = upstream.wait_for(1)[0]
    assert got.header("Mcp-Param-Region") == ["eu"] and got.header("Mcp-Name") == [sentinel]


# -- relaying ------------------------------------------------------------------------------------


def test_relayed_requests_keep_mcp_headers_drop_credentials_and_identity_and_add_the_upstreams(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, allow_origins=("http://ok.example",))
    upstream.default = with_id(lambda i: result_for({"id": i}, {"tools": []}),
                               headers={"Mcp-Session-Id": "s-1", "MCP-Protocol-Version": "2025-11-25", "X-Upstream": "no",
                                        "Set-Cookie": "u=1", "WWW-Authenticate": "Bearer"})  # fmt: skip
    body = b'{ "jsonrpc": "2.0",  "id": 3, "method": "tools/list", "params": {"cursor": "c\\u00e9"} }'
    sent = [("Authorization", "Bearer client-token"), ("Cookie", "c=1"), ("X-Agent", "a"), ("X-User", "u"),
            ("Origin", "http://ok.example"), ("Mcp-Session-Id", "s-1"), ("MCP-Protocol-Version", "2025-11-25"),
            ("Accept", "application/json, text/event-stream"), ("Last-Event-ID", "7"), ("X-Other", "y"),
            ("Connection", "keep-alive"), ("Proxy-Authorization", "p")]  # fmt: skip
    status, headers, answer = gw.post(body, sent)
    assert status == 200
    got = upstream.wait_for(1)[0]
    assert got.body == wire.dumps(wire.parse_message(body))  # our own serialization, never the client's bytes
    assert got.header("Authorization") == ["Bearer upstream-token"]
    for name in ("Cookie", "X-Agent", "X-User", "Origin", "X-Other", "Proxy-Authorization"):
        assert got.header(name) == [], name
    assert got.header("Host") == [upstream.url.split("/")[2]]
    assert got.header("Mcp-Session-Id") == ["s-1"] and got.header("MCP-Protocol-Version") == ["2025-11-25"]
    assert got.header("Accept") == ["application/json, text/event-stream"] and got.header("Last-Event-ID") == ["7"]
    assert headers["Mcp-Session-Id"] == "s-1" and headers["MCP-Protocol-Version"] == "2025-11-25"
    for name in ("X-Upstream", "Set-Cookie", "WWW-Authenticate"):
        assert headers[name] is None, name
    assert json.loads(answer) == {"jsonrpc": "2.0", "id": 3, "result": {"tools": []}}
    assert gw.catalog.results == [("tools/list", json.loads(answer))]


def test_intercepted_calls_get_the_upstream_credentials_not_the_clients(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    gw.post(call(), [*AGENT, ("Authorization", "Bearer client-token"), ("Cookie", "c=1"), ("Mcp-Session-Id", "s-9")])
    got = upstream.wait_for(1)[0]
    assert got.header("Authorization") == ["Bearer upstream-token"]
    assert got.header("Cookie") == [] and got.header("X-Agent") == []
    assert got.header("Mcp-Session-Id") == ["s-9"]
    assert got.body == wire.dumps(call())


def test_notifications_and_responses_are_answered_as_upstream_answered_202(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = {"jsonrpc": "2.0", "id": "s-1", "result": {"action": "accept"}}
    for message in (notification, response):
        status, headers, body = gw.post(message, [("Mcp-Session-Id", "s-1")])
        assert (status, body) == (202, b"")
    assert [r.message() for r in upstream.wait_for(2)] == [notification, response]
    assert gw.interceptor.seen == []


def test_session_ids_are_kept_and_never_minted(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
    upstream.script(with_id(lambda i: result_for({"id": i}, {"protocolVersion": "2025-11-25"}), headers={"Mcp-Session-Id": "up-7"}))
    status, headers, _ = gw.post(initialize)
    assert (status, headers["Mcp-Session-Id"]) == (200, "up-7")
    assert gw.catalog.results[0][0] == "initialize"
    upstream.script(with_id(lambda i: result_for({"id": i}, {})))
    _, headers, _ = gw.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert headers["Mcp-Session-Id"] is None  # the upstream named none, so neither does the gateway


def test_relayed_sse_streams_event_by_event_keeping_event_ids(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(sse(event(PROGRESS, "e-1"), b": ping\n\n", release, final({"messages": []}, "e-2")))
    conn = gw.send({"jsonrpc": "2.0", "id": 5, "method": "prompts/get", "params": {"name": "p"}}, [("Mcp-Name", "p")])
    response = conn.getresponse()
    assert response.status == 200 and response.headers.get_content_type() == "text/event-stream"
    first = next_event(response)  # arrives while the upstream still holds the rest
    assert first is not None and first["id"] == "e-1" and json.loads(first["data"]) == PROGRESS
    release.set()
    last = next_event(response)
    assert last is not None and last["id"] == "e-2" and json.loads(last["data"])["result"] == {"messages": []}
    assert next_event(response) is None
    conn.close()
    assert gw.catalog.notifications == [PROGRESS]
    assert gw.catalog.results == [("prompts/get", json.loads(last["data"]))]


def test_get_and_delete_are_relayed(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    upstream.script(sse(event(PROGRESS, "g-1")), raw(204, b"", None))
    status, headers, body = gw.post(None, [("Mcp-Session-Id", "s-1"), ("Last-Event-ID", "g-0")], method="GET")
    assert status == 200 and [e["id"] for e in parse_events(body)] == ["g-1"]
    status, _, _ = gw.post(None, [("Mcp-Session-Id", "s-1")], method="DELETE")
    assert status == 204
    got = upstream.wait_for(2)
    assert [(r.method, r.header("Mcp-Session-Id")) for r in got] == [("GET", ["s-1"]), ("DELETE", ["s-1"])]
    assert got[0].header("Last-Event-ID") == ["g-0"]


def test_a_relayed_requests_challenge_is_not_relayed_and_html_is_dropped(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    upstream.script(raw(401, b"", None, {"WWW-Authenticate": 'Bearer resource_metadata="x"'}),
                    raw(404, b"<html>gone</html>", "text/html"))  # fmt: skip
    status, headers, _ = gw.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert status == 502 and headers["WWW-Authenticate"] is None
    status, headers, body = gw.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert (status, body) == (404, b"")  # a session the upstream lost stays a 404


# -- intercepted calls: what each upstream behaviour is observed as --------------------------------


def _error(code: int) -> Callable[[Any], bytes]:
    return lambda i: json.dumps({"jsonrpc": "2.0", "id": i, "error": {"code": code, "message": "after the tool ran"}}).encode()


ROWS = {
    "json": (with_id(lambda i: result_for({"id": i}, {"content": []})), Answered, None),
    "json-rpc-error": (with_id(_error(-32600)), Answered, None),
    "json-rpc-error-on-400": (with_id(_error(-32602), status=400), Answered, None),
    "sse-final": (sse(event(PROGRESS, "1"), final({"content": []}, "2")), Answered, None),
    "html-404": (raw(404, b"<html>no</html>", "text/html"), Broken, Transport.UNREADABLE_RESPONSE),
    "html-500": (raw(500, b"<html>oops</html>", "text/html"), Broken, Transport.UNREADABLE_RESPONSE),
    "429": (raw(429, b"", None), Broken, Transport.UNREADABLE_RESPONSE),
    "redirect": (raw(307, b"", None, {"Location": "http://127.0.0.1:1/mcp"}), Broken, Transport.UNREADABLE_RESPONSE),
    "403-plain": (raw(403, b"", None), Broken, Transport.UNREADABLE_RESPONSE),
    "401": (raw(401, b"", None, {"WWW-Authenticate": "Bearer"}), Challenged, 401),
    "403-challenge": (raw(403, b"denied", "text/plain", {"WWW-Authenticate": "Bearer"}), Challenged, 403),
    "wrong-id": (with_id(lambda i: result_for({"id": i + 1}, {})), Broken, Transport.UNREADABLE_RESPONSE),
    "non-strict": (with_id(lambda i: b'{"jsonrpc":"2.0","id":%d,"result":{},"result":{}}' % i), Broken, Transport.UNREADABLE_RESPONSE),
    "empty-200": (raw(200, b"", None), Broken, Transport.UNREADABLE_RESPONSE),
    "dropped": (drop(), Broken, Transport.AFTER_REQUEST_SENT),
    "sse-truncated": (sse(event(PROGRESS, "1"), b'data: {"jsonrpc":"2.0","id":1,'), Broken, Transport.STREAM_ENDED_EARLY),
    "sse-wrong-id": (sse(lambda i: event({"jsonrpc": "2.0", "id": i + 1, "result": {}})), Broken, Transport.UNREADABLE_RESPONSE),
    "sse-not-utf8": (sse(b"data: \xff\xfe\n\n"), Broken, Transport.UNREADABLE_RESPONSE),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_each_upstream_behaviour_is_observed_as_its_row(upstream: FakeUpstream, gateway_for: Any, row: str) -> None:
    step, observed, detail = ROWS[row]
    upstream.script(step)
    gw = gateway_for(upstream.url)
    status, headers, body = gw.post(call(7), [*AGENT, ("X-User", "u-1")])
    seen = gw.interceptor.settled()
    assert isinstance(seen.observation, observed), seen.observation
    if isinstance(seen.observation, Broken):
        assert seen.observation.transport is detail
    if isinstance(seen.observation, Challenged):
        assert seen.observation.status == detail
    assert seen.principal == Principal("agent-1", "u-1")
    assert status == 200  # every JSON-RPC answer goes out with 200
    assert headers["WWW-Authenticate"] is None
    answers = messages_of(headers, body)
    if isinstance(seen.observation, Answered):
        assert answers[-1] == seen.observation.message
    else:
        assert answers[-1]["id"] == 7 and answers[-1]["error"]["code"] == -41010
    assert upstream.received[0].body == wire.dumps(call(7))


def test_an_upstream_with_nothing_listening_is_never_connected(gateway_for: Any) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    try:
        gw = gateway_for(f"http://127.0.0.1:{closed.getsockname()[1]}/mcp")
        status, _, body = gw.post(call(), AGENT)
    finally:
        closed.close()
    assert isinstance(gw.interceptor.settled().observation, NeverConnected)
    assert status == 200 and json.loads(body)["error"]["code"] == -41011


def test_a_server_to_client_request_during_a_call_is_relayed_and_its_reply_goes_upstream(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    replied = threading.Event()
    elicit = {"jsonrpc": "2.0", "id": "s-1", "method": "elicitation/create", "params": {"message": "sure?"}}
    upstream.script(sse(event(elicit, "ev-1"), replied, final({"content": [{"type": "text", "text": "done"}]}, "ev-2")))
    conn = gw.send(call(9), AGENT)
    response = conn.getresponse()
    question = next_event(response)
    assert question is not None and question["id"] == "ev-1" and json.loads(question["data"]) == elicit
    answer = {"jsonrpc": "2.0", "id": "s-1", "result": {"action": "accept", "content": {}}}
    assert gw.post(answer)[0] == 202
    assert upstream.wait_for(2)[1].message() == answer
    replied.set()
    last = next_event(response)
    assert last is not None and last["id"] == "ev-2"
    assert json.loads(last["data"])["result"]["content"][0]["text"] == "done"
    assert next_event(response) is None
    conn.close()
    assert isinstance(gw.interceptor.settled().observation, Answered)


def test_principal_headers_blank_absent_and_sent_twice(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    gw.post(call(1), [("X-Agent", "  ")])
    gw.post(call(2), [("X-User", "u")])
    gw.post(call(3), [("X-Agent", "a"), ("X-Agent", "b")])
    gw.post(call(4), [("X-Agent", "a"), ("X-User", "u"), ("X-User", "v")])
    gw.post(call(5), [("X-Agent", "a")])
    principals = [gw.interceptor.settled(i).principal for i in range(5)]
    assert principals[:2] == [None, None]
    assert isinstance(principals[2], str) and "X-Agent" in principals[2]
    assert isinstance(principals[3], str) and "X-User" in principals[3]
    assert principals[4] == Principal("a", None)


def test_a_configured_principal_ignores_headers(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url, principal=("fixed", "ops"), principal_header=None, user_header=None)
    gw.post(call(), [("X-Agent", "other")])
    assert gw.interceptor.settled().principal == Principal("fixed", "ops")


# -- cancellation ------------------------------------------------------------------------------


def test_notifications_cancelled_cancels_the_in_flight_call(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(hold(release))
    conn = gw.send(call(11), [*AGENT, ("Mcp-Session-Id", "s-1")])
    upstream.wait_for(1)
    status, _, body = gw.post(call(11), [*AGENT, ("Mcp-Session-Id", "s-1")])
    assert (status, json.loads(body)["error"]["code"]) == (400, wire.INVALID_REQUEST)  # its id is in flight
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 11, "reason": "user"}}
    assert gw.post(cancel, [("Mcp-Session-Id", "s-1")])[0] == 202
    seen = gw.interceptor.settled()
    assert isinstance(seen.observation, Cancelled)
    response = conn.getresponse()
    assert response.status == 200 and response.read() == b""  # ended cleanly, nothing sent for it
    conn.close()
    assert upstream.wait_for(2)[1].message() == cancel  # the cancel is relayed
    release.set()


def test_a_cancel_naming_another_session_cancels_nothing(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(hold(release, with_id(lambda i: result_for({"id": i}, {"content": []}))))
    conn = gw.send(call(11), [*AGENT, ("Mcp-Session-Id", "s-1")])
    upstream.wait_for(1)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 11}}
    assert gw.post(cancel, [("Mcp-Session-Id", "s-2")])[0] == 202
    release.set()
    response = conn.getresponse()
    assert json.loads(response.read())["result"] == {"content": []}
    conn.close()
    assert isinstance(gw.interceptor.settled().observation, Answered)


def test_the_client_closing_its_connection_cancels_the_call(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(hold(release))
    conn = gw.send(call(12), AGENT)
    upstream.wait_for(1)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert isinstance(gw.interceptor.settled().observation, Cancelled)
    release.set()


def test_the_client_closing_while_the_call_streams_cancels_it(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(sse(event(PROGRESS, "1"), release, final({"content": []})))
    conn = gw.send(call(13), AGENT)
    response = conn.getresponse()
    assert next_event(response) is not None
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert isinstance(gw.interceptor.settled().observation, Cancelled)
    release.set()


def test_a_cancel_before_the_call_was_forwarded_is_provably_never_connected(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    gate = threading.Event()
    gw.interceptor.before = lambda seen: gate.wait(WAIT)
    conn = gw.send(call(14), [*AGENT, ("Mcp-Session-Id", "s-1")])
    gw.interceptor.wait_for(1)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 14}}
    assert gw.post(cancel, [("Mcp-Session-Id", "s-1")])[0] == 202
    gate.set()
    assert isinstance(gw.interceptor.settled().observation, NeverConnected)
    assert conn.getresponse().read() == b""
    conn.close()
    assert [r.message() for r in upstream.wait_for(1)] == [cancel]  # only the cancel went upstream


# -- logs --------------------------------------------------------------------------------------


def test_logs_escape_control_characters_from_the_peer(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    assert gw.post(call(), [*AGENT, ("Origin", "http://evil\x1b[2J\x85.example")])[0] == 403
    text = gw.log.getvalue()
    assert "refused" in text and "\\x1b[2J" in text and "\\x85" in text
    assert "\x1b" not in text and "\x85" not in text


def test_logs_escape_control_characters_in_what_the_client_sent(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    upstream.script(raw(200, b"<html>not json</html>", "text/html"))
    method = "evil\x1b[2J\u202e\u2028name"
    assert gw.post({"jsonrpc": "2.0", "id": 1, "method": method})[0] == 502
    text = gw.log.getvalue()
    assert "evil\\x1b[2J\\u202e\\u2028name" in text
    assert not any(char in text for char in "\x1b\u202e\u2028")


# -- answers outside their request's stream, and closing ----------------------------------------


def test_answers_on_a_get_stream_are_routed_by_the_remembered_method_and_a_calls_is_dropped(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    upstream.script(raw(202, b"", None), with_id(lambda i: result_for({"id": i}, {"content": []})))
    session = [("Mcp-Session-Id", "s-1")]
    gw.post({"jsonrpc": "2.0", "id": 20, "method": "tools/list"}, session)  # answered (202) on no stream
    gw.post(call(21), [*AGENT, *session])
    late_list = {"jsonrpc": "2.0", "id": 20, "result": {"tools": []}}
    late_call = {"jsonrpc": "2.0", "id": 21, "result": {"content": [{"type": "text", "text": "again"}]}}
    upstream.script(sse(event(late_call, "r-1"), event(late_list, "r-2")))
    status, headers, body = gw.post(None, session, method="GET")
    assert status == 200
    assert [(e["id"], json.loads(e["data"])) for e in parse_events(body)] == [("r-2", late_list)]
    assert ("tools/list", late_list) in gw.catalog.results


def test_close_ends_open_streams_and_returns(upstream: FakeUpstream, gateway_for: Any) -> None:
    gw = gateway_for(upstream.url)
    release = threading.Event()
    upstream.script(sse(event(PROGRESS, "g-1"), release))
    conn = gw.send(None, [("Mcp-Session-Id", "s-1")], method="GET")
    response = conn.getresponse()
    assert next_event(response) is not None
    gw.listening.close()  # returns although the upstream still holds the stream open
    try:
        while response.read(1):
            pass
    except (OSError, http.client.HTTPException):
        pass  # cut off or ended: either way the stream is over
    conn.close()
    release.set()
