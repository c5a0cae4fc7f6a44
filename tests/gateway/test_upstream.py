"""The test upstream itself, spoken to by the SDK's real client (no gateway in between).

For {stdio, http} x {legacy (2025-11-25), auto (2026-07-28)}: listing, a counted refund that
records its wire arguments and idempotency token, a read-only lookup, ``boom`` as an ``isError``
result, ``confirm_delete`` by elicitation (handshake) or ``input_required`` (2026-07-28),
``resources/read`` and ``prompts/get``. Every misbehaving mode runs the tool (one counter line)
and the client sees a failure; raw exchanges pin down the exact bytes the gateway will see.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types
import pytest
from mcp import MCPError

from .conftest import (MODES, REVISION, TRANSPORTS, Counter, Mode, RawStdio, Transport, confirming, connect,
                       upstream_stdio_command)
from .upstream import GARBAGE_LINE, TOKEN_KEY, UPSTREAM_NAME, WRONG_ID
from .upstream_http import CHALLENGE

REFUND = {"order_id": "42", "amount_cents": 1250}
#: The refund arguments as the SDK client puts them on the wire (insertion order).
REFUND_WIRE = '{"order_id":"42","amount_cents":1250}'
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
MODERN_HEADERS = {
    "MCP-Protocol-Version": "2026-07-28",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "refund",
}


def target(transport: Transport, counter: Counter, upstream_http: Any, misbehave: str | None = None) -> Any:
    if transport == "stdio":
        return upstream_stdio_command(counter, misbehave)
    return upstream_http(misbehave).url


def text(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_resources_and_prompts(transport: Transport, mode: Mode, counter: Counter, upstream_http: Any) -> None:
    url_or_command = target(transport, counter, upstream_http)
    seen: list[Any] = []

    async def session() -> None:
        async with connect(transport, mode, url_or_command, elicitation_callback=confirming(seen=seen)) as client:
            assert client.protocol_version == REVISION[mode]
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"refund", "lookup", "boom", "confirm_delete"}
            assert tools["refund"].input_schema["required"] == ["order_id", "amount_cents"]
            assert set(tools["confirm_delete"].input_schema["properties"]) == {"path"}

            refund = await client.call_tool("refund", REFUND, meta={TOKEN_KEY: "tok-1"})
            assert not refund.is_error
            assert refund.structured_content == {"refund_id": "re_42", "order_id": "42", "amount_cents": 1250,
                                                 "currency": "EUR"}  # fmt: skip
            assert counter.count() == 1

            lookup = await client.call_tool("lookup", {"order_id": "42"})
            assert not lookup.is_error and text(lookup) == "order 42: paid, 4200 EUR"
            assert counter.count() == 1  # read-only: not counted

            boom = await client.call_tool("boom", {})
            assert boom.is_error and "boom: the tool ran and failed" in text(boom)

            # Elicitation (handshake) or input_required (2026-07-28): the client's callback answers.
            confirmed = await client.call_tool("confirm_delete", {"path": "/srv/a"})
            assert not confirmed.is_error and text(confirmed) == "deleted /srv/a"

            resource = await client.read_resource("orders://42")
            assert [content.text for content in resource.contents] == ["order 42: paid"]
            prompt = await client.get_prompt("refund_prompt", {"order_id": "42"})
            assert [message.content.text for message in prompt.messages] == ["Please refund order 42."]
            if mode == "auto":  # 2026-07-28 results carry the server's stamp in _meta
                assert (refund.meta or {})["io.modelcontextprotocol/serverInfo"]["name"] == UPSTREAM_NAME

    anyio.run(session)
    refund, boom, confirm = counter.executions()
    assert refund == {"tool": "refund", "arguments": REFUND, "received": REFUND_WIRE, "token": "tok-1",
                      "protocol": REVISION[mode]}  # fmt: skip
    assert boom == {"tool": "boom", "arguments": {}, "received": "{}", "token": None, "protocol": REVISION[mode]}
    assert confirm["arguments"] == {"path": "/srv/a"} and confirm["confirmed"] is True
    assert [params.message for params in seen] == ["Delete /srv/a?"]
    assert seen[0].requested_schema["properties"]["confirm"]["type"] == "boolean"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_confirm_delete_declined_keeps_the_file(transport: Transport, counter: Counter, upstream_http: Any) -> None:
    url_or_command = target(transport, counter, upstream_http)

    async def decline(context: Any, params: Any) -> Any:
        return mcp_types.ElicitResult(action="decline")

    async def session() -> None:
        async with connect(transport, "legacy", url_or_command, elicitation_callback=decline) as client:
            assert text(await client.call_tool("confirm_delete", {"path": "/srv/b"})) == "kept /srv/b"

    anyio.run(session)
    assert [(run["answer"], run["confirmed"]) for run in counter.executions()] == [("decline", False)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_input_required_round_trip(transport: Transport, counter: Counter, upstream_http: Any) -> None:
    """2026-07-28: the first round answers ``input_required`` without running the tool; the
    continuation (a new request with ``inputResponses`` and the unchanged ``requestState``) runs it."""
    url_or_command = target(transport, counter, upstream_http)

    async def session() -> None:
        # The callback declares the elicitation capability; this test answers the question itself.
        async with connect(transport, "auto", url_or_command, elicitation_callback=confirming()) as client:
            first = await client.session.call_tool("confirm_delete", {"path": "/srv/c"}, allow_input_required=True)
            assert isinstance(first, mcp_types.InputRequiredResult)
            assert first.result_type == "input_required"
            [(key, request)] = (first.input_requests or {}).items()
            assert key.endswith(":ask_to_delete")
            assert isinstance(request, mcp_types.ElicitRequest) and request.params.message == "Delete /srv/c?"
            assert first.request_state  # sealed by the server, opaque to the client
            assert counter.count() == 0

            answers = {key: mcp_types.ElicitResult(action="accept", content={"confirm": True})}
            final = await client.session.call_tool(
                "confirm_delete", {"path": "/srv/c"}, input_responses=answers, request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(final, mcp_types.CallToolResult) and final.result_type == "complete"
            assert text(final) == "deleted /srv/c"

    anyio.run(session)
    assert [run["confirmed"] for run in counter.executions()] == [True]


def test_http_stateless_and_json_response(counter: Counter, upstream_http: Any) -> None:
    stateless = upstream_http(stateless=True).url
    json_only = upstream_http(json_response=True).url

    async def session() -> None:
        for url in (stateless, json_only):
            for mode in MODES:
                async with connect("http", mode, url) as client:
                    assert not (await client.call_tool("refund", REFUND)).is_error

    anyio.run(session)
    assert counter.count("refund") == 4


def test_http_subprocess(counter: Counter) -> None:
    """``upstream.py --transport http --port 0`` prints its URL once it listens."""
    command = [*upstream_stdio_command(counter), "--transport", "http", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/mcp")
            url = line.removeprefix("listening on ")

            async def session() -> None:
                async with connect("http", "auto", url) as client:
                    assert not (await client.call_tool("refund", REFUND)).is_error

            anyio.run(session)
        finally:
            process.terminate()
    assert counter.count("refund") == 1


# Misbehaving upstreams: the tool runs, then the answer is lost or replaced.


async def call_refund(transport: Transport, mode: Mode, url_or_command: Any) -> Any:
    """The refund's result; an ``MCPError`` is raised as it is (not in the client's exception group)."""
    async with connect(transport, mode, url_or_command) as client:
        try:
            return await client.call_tool("refund", REFUND)
        except MCPError as error:
            failure = error
    raise failure


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("misbehave, code", [("exit_after", -32000), ("invalid_request_after", -32600)])
def test_stdio_misbehaving_error(misbehave: str, code: int, mode: Mode, counter: Counter) -> None:
    with pytest.raises(MCPError) as raised:
        anyio.run(call_refund, "stdio", mode, upstream_stdio_command(counter, misbehave))
    assert raised.value.code == code
    assert counter.count("refund") == 1


@pytest.mark.parametrize("mode", MODES)
def test_stdio_garbage_after(mode: Mode, counter: Counter) -> None:
    """The SDK client hands the unparseable line to its message handler; the call never returns."""
    broken: list[Exception] = []

    async def session() -> None:
        arrived = anyio.Event()

        async def handler(message: Any) -> None:
            if isinstance(message, Exception):
                broken.append(message)
                arrived.set()

        command = upstream_stdio_command(counter, "garbage_after")
        async with connect("stdio", mode, command, message_handler=handler) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "refund", REFUND)
                with anyio.fail_after(60):
                    await arrived.wait()
                group.cancel_scope.cancel()

    anyio.run(session)
    assert broken and "JSON" in str(broken[0])
    assert counter.count("refund") == 1


@pytest.mark.parametrize("mode", MODES)
def test_stdio_wrong_id_after(mode: Mode, counter: Counter) -> None:
    """The SDK client drops an answer with an unknown id (a debug log line) and keeps waiting."""
    dropped: list[str] = []

    async def session() -> None:
        arrived = anyio.Event()

        class Dropped(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "unknown/late request id" in record.getMessage():
                    dropped.append(record.getMessage())
                    arrived.set()

        dispatcher_log = logging.getLogger("mcp.shared.jsonrpc_dispatcher")
        handler, level = Dropped(logging.DEBUG), dispatcher_log.level
        dispatcher_log.addHandler(handler)
        dispatcher_log.setLevel(logging.DEBUG)
        try:
            async with connect("stdio", mode, upstream_stdio_command(counter, "wrong_id_after")) as client:
                async with anyio.create_task_group() as group:
                    group.start_soon(client.call_tool, "refund", REFUND)
                    with anyio.fail_after(60):
                        await arrived.wait()
                    group.cancel_scope.cancel()
        finally:
            dispatcher_log.removeHandler(handler)
            dispatcher_log.setLevel(level)

    anyio.run(session)
    assert dropped and repr(WRONG_ID) in dropped[0]
    assert counter.count("refund") == 1


def refund_request(id: int = 7) -> dict[str, Any]:
    """A 2026-07-28 ``tools/call`` as it goes over the wire (envelope in ``_meta``, no handshake)."""
    params = {"name": "refund", "arguments": REFUND, "_meta": ENVELOPE}
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


@pytest.mark.parametrize("misbehave", ["garbage_after", "wrong_id_after"])
def test_stdio_misbehaving_wire(misbehave: str, counter: Counter) -> None:
    """The exact line instead of the answer (a 2026-07-28 call: no handshake needed)."""
    with RawStdio(upstream_stdio_command(counter, misbehave)) as peer:
        peer.send(refund_request())
        line = peer.receive()
        if misbehave == "garbage_after":
            assert line.decode().rstrip("\n") == GARBAGE_LINE
        else:
            answer = json.loads(line)
            assert answer["id"] == WRONG_ID and answer["result"]["resultType"] == "complete"
    assert counter.count("refund") == 1


HTTP_FAILURES: dict[str, dict[str, int]] = {
    # What the SDK 2.3.0 client makes of each (MCPError.code), per mode.
    "truncate_after": {"legacy": -32000, "auto": -32700},
    "html404_after": {"legacy": -32600, "auto": -32601},
    "html500_after": {"legacy": -32603, "auto": -32603},
    "invalid_request_after": {"legacy": -32600, "auto": -32600},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("misbehave", sorted(HTTP_FAILURES))
def test_http_misbehaving_error(misbehave: str, mode: Mode, counter: Counter, upstream_http: Any) -> None:
    url = upstream_http(misbehave).url
    with pytest.raises(MCPError) as raised:
        anyio.run(call_refund, "http", mode, url)
    assert raised.value.code == HTTP_FAILURES[misbehave][mode]
    assert counter.count("refund") == 1


@pytest.mark.parametrize("mode", MODES)
def test_http_drop_after(mode: Mode, counter: Counter, upstream_http: Any) -> None:
    url = upstream_http("drop_after").url
    with pytest.raises(BaseExceptionGroup) as raised:
        anyio.run(call_refund, "http", mode, url)
    assert raised.group_contains(httpx2.RemoteProtocolError)
    assert counter.count("refund") == 1


@pytest.mark.parametrize("mode", MODES)
def test_http_challenge_does_not_run_the_tool(mode: Mode, counter: Counter, upstream_http: Any) -> None:
    url = upstream_http("challenge").url
    with pytest.raises(MCPError) as raised:
        anyio.run(call_refund, "http", mode, url)
    assert raised.value.code == -32603
    assert counter.count() == 0


@pytest.mark.parametrize("mode", MODES)
def test_http_misbehaving_after_a_question(mode: Mode, counter: Counter, upstream_http: Any) -> None:
    """Handshake era: a question sent mid-call over SSE lets the whole stream through unchanged
    (the status line has gone out); 2026-07-28: the question round passes, the answer is cut."""
    url = upstream_http("truncate_after").url

    async def session() -> Any:
        async with connect("http", mode, url, elicitation_callback=confirming()) as client:
            try:
                return await client.call_tool("confirm_delete", {"path": "/srv/d"})
            except MCPError as error:
                return error

    outcome = anyio.run(session)
    if mode == "legacy":
        assert text(outcome) == "deleted /srv/d"
    else:
        assert isinstance(outcome, MCPError) and outcome.code == -32700
    assert counter.count("confirm_delete") == 1


def post_refund(url: str) -> httpx2.Response:
    with httpx2.Client(trust_env=False, timeout=60) as client:
        return client.post(url, content=json.dumps(refund_request()), headers=MODERN_HEADERS)


@pytest.mark.parametrize("misbehave", sorted(HTTP_FAILURES) + ["drop_after", "challenge", None])
def test_http_misbehaving_wire(misbehave: str | None, counter: Counter, upstream_http: Any) -> None:
    """One 2026-07-28 POST, read with a plain HTTP client: the exact status, headers and body."""
    url = upstream_http(misbehave).url
    if misbehave == "drop_after":
        with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
            post_refund(url)
        assert counter.count("refund") == 1
        return
    response = post_refund(url)
    body = response.content
    if misbehave is None:
        assert response.status_code == 200 and json.loads(body)["result"]["resultType"] == "complete"
    elif misbehave == "truncate_after":
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert body.startswith(b'{"jsonrpc":"2.0","id":7,"result":{')
        with pytest.raises(ValueError):
            json.loads(body)
    elif misbehave in ("html404_after", "html500_after"):
        assert response.status_code == (404 if misbehave == "html404_after" else 500)
        assert response.headers["content-type"].startswith("text/html") and body.startswith(b"<!DOCTYPE html>")
    elif misbehave == "invalid_request_after":
        assert response.status_code == 400
        assert json.loads(body)["id"] == 7 and json.loads(body)["error"]["code"] == -32600
    else:  # challenge
        assert response.status_code == 401 and response.headers["www-authenticate"] == CHALLENGE
        assert counter.count() == 0
        return
    assert counter.count("refund") == 1


def test_unknown_misbehaviour_is_refused(counter: Counter, upstream_http: Any) -> None:
    with pytest.raises(ValueError, match="over HTTP, use one of"):
        upstream_http("exit_after")
    result = subprocess.run([*upstream_stdio_command(counter, "drop_after")], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode != 0 and "over stdio, use one of" in result.stderr


# The documented example (examples/mcp): the server works with the real client, the policy decides.

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp"


@pytest.mark.parametrize("mode", MODES)
def test_example_refund_server(mode: Mode) -> None:
    async def session() -> None:
        async with connect("stdio", mode, [sys.executable, str(EXAMPLE / "refund_server.py")]) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"lookup", "refund"}
            assert tools["refund"].input_schema["properties"]["amount_cents"]["exclusiveMinimum"] == 0
            token = {"com.ctrlrun/idempotency_token": "tok-9"}
            first = await client.call_tool("refund", {"order_id": "ord_1001", "amount_cents": 1500}, meta=token)
            again = await client.call_tool("refund", {"order_id": "ord_1001", "amount_cents": 1500}, meta=token)
            assert first.structured_content == again.structured_content
            assert first.structured_content["refund_id"] == "re_1"
            order = await client.call_tool("lookup", {"order_id": "ord_1001"})
            assert order.structured_content["refunded_cents"] == 1500
            assert (await client.call_tool("lookup", {"order_id": "nope"})).is_error

    anyio.run(session)


def test_example_policy() -> None:
    from ctrlrun import Action, Control, InMemoryStateStore, Policy, Principal

    policy = Policy.from_file(EXAMPLE / "ctrlrun.yaml")
    assert policy.unenforced_features() == []
    Control(policy, InMemoryStateStore())
    agent = Principal("agent:support")
    decisions = {
        ("mcp.pay.lookup", "ord_1001", None): "allow",
        ("mcp.pay.refund", "ord_1001", 1): "allow",
        ("mcp.pay.refund", "ord_1001", 5000): "allow",
        ("mcp.pay.refund", "ord_1001", 5001): "approve",
        ("mcp.pay.refund", "ord_1001", 0): "deny",
        ("mcp.pay.unknown", "ord_1001", None): "deny",
    }
    for (action, order_id, amount), decision in decisions.items():
        arguments: dict[str, Any] = {"order_id": order_id}
        if amount is not None:
            arguments["amount_cents"] = amount
        assert str(policy.evaluate(Action(action, arguments, agent)).decision) == decision, (action, amount)
    assert policy.effect_template("mcp.pay.refund") == "refund:{order_id}"
    assert policy.effect_template("mcp.pay.lookup") is None
