"""The gateway end to end over stdio: the SDK's real client launches ``ctrlrun gateway`` (a
subprocess), which launches the real upstream MCP server; in both protocol eras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from .._cli_helpers import invoke
from .conftest import MODES, Counter, Mode, RawStdio, confirming, connect, upstream_stdio_command
from .e2e import FLAGGED, Site, refused
from .upstream import TOKEN_KEY

RECEIPT = "com.ctrlrun/receipt"


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def run(body: Any) -> Any:
    return anyio.run(body)




@pytest.mark.parametrize("mode", MODES)
def test_transparency_and_an_allowed_call(mode: Mode, site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter))
    seen: list[Any] = []

    async def session() -> None:
        async with connect("stdio", mode, command, env=site.env(), elicitation_callback=confirming(seen=seen)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"refund", "lookup", "boom", "confirm_delete"}
            result = await client.call_tool("refund", {"order_id": "42", "amount_cents": 1250})
            assert not result.is_error
            stamp = result.meta[RECEIPT]
            assert stamp["result"] == "committed" and stamp["effect_key"] == "refund:42"
            assert (await client.call_tool("lookup", {"order_id": "42"})).content[0].text == "order 42: paid, 4200 EUR"
            assert (await client.read_resource("orders://42")).contents
            assert (await client.get_prompt("refund_prompt", {"order_id": "42"})).messages
            deleted = await client.call_tool("confirm_delete", {"path": "/tmp/x"})
            assert not deleted.is_error and deleted.meta[RECEIPT]["result"] == "committed"

    run(session)
    (refund,) = counter.executions("refund")
    assert refund["received"] == '{"amount_cents":1250,"order_id":"42"}'  # canonical: keys sorted
    assert refund["token"] is not None and len(refund["token"]) == 36
    assert [e["confirmed"] for e in counter.executions("confirm_delete")] == [True]
    assert len(seen) == 1
    assert site.results().count("committed") == 3


@pytest.mark.parametrize("mode", MODES)
def test_the_approval_round_trip(mode: Mode, site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter))
    big = {"order_id": "77", "amount_cents": 9000}

    async def session() -> None:
        async with connect("stdio", mode, command, env=site.env()) as client:
            first = await refused(client, "refund", big)
            assert first.code == -41002
            request_id = first.data["request_id"]
            assert f"ctrlrun approve {request_id}" in first.message
            again = await refused(client, "refund", big)
            assert again.code == -41002 and again.data["request_id"] == request_id
            approved = invoke(["approve", request_id, "--store-url", site.store_url])
            assert approved.code == 0, approved
            ran = await client.call_tool("refund", big)
            assert ran.meta[RECEIPT]["result"] == "committed"
            assert (await refused(client, "refund", big)).code == -41004
            changed = await refused(client, "refund", {"order_id": "78", "amount_cents": 9000})
            assert changed.code == -41002 and changed.data["request_id"] != request_id
            assert invoke(["deny", changed.data["request_id"], "--store-url", site.store_url]).code == 0
            denied = await refused(client, "refund", {"order_id": "78", "amount_cents": 9000})
            assert denied.code == -41003

    run(session)
    assert counter.count("refund") == 1
    approved = [r for r in site.receipts() if str(r.result) == "committed"]
    assert [r.approver for r in approved] == ["cli:local"]
    assert site.results() == ["committed", "blocked", "denied"]  # waiting for a human leaves none


@pytest.mark.parametrize("misbehave", ["invalid_request_after", "wrong_id_after"])
def test_a_lost_or_unusable_reply_is_ambiguous_and_the_retry_is_refused(misbehave: str, site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter, misbehave), "--upstream-timeout", "3")

    async def session() -> None:
        async with connect("stdio", "legacy", command, env=site.env()) as client:
            lost = await refused(client, "refund", {"order_id": "5", "amount_cents": 100})
            if misbehave == "invalid_request_after":
                assert lost.code == -32600  # the upstream's own answer, relayed
            else:
                assert lost.code == -41010 and lost.data["effect_key"] == "refund:5"
            retry = await refused(client, "refund", {"order_id": "5", "amount_cents": 100})
            assert retry.code == -41005 and "ctrlrun resolve refund:5" in retry.message

    run(session)
    assert counter.count("refund") == 1
    assert site.results() == ["ambiguous", "blocked"]


def test_a_child_that_exits_mid_call_leaves_the_call_ambiguous(site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter, "exit_after"))
    with RawStdio(command, env={**site.env()}) as raw:
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})  # fmt: skip
        assert json.loads(raw.receive())["result"]["protocolVersion"] == "2025-11-25"
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "refund", "arguments": {"order_id": "9", "amount_cents": 1}}})  # fmt: skip
        answer = json.loads(raw.receive())
        assert answer["id"] == 2 and answer["error"]["code"] == -41010
        assert raw.close() == 1
    assert counter.count("refund") == 1 and site.results() == ["ambiguous"]


@pytest.mark.parametrize(("policy", "expected"), [(None, "ambiguous"), (FLAGGED, "failed")])
def test_an_is_error_result_is_relayed(policy: str | None, expected: str, tmp_path: Path, counter: Counter) -> None:
    site = Site(tmp_path) if policy is None else Site(tmp_path, policy)
    command = site.gateway(upstream_stdio_command(counter))

    async def session() -> None:
        async with connect("stdio", "auto", command, env=site.env()) as client:
            result = await client.call_tool("boom", {})
            assert result.is_error and result.meta[RECEIPT]["result"] == expected
            again = await client.call_tool("boom", {}) if expected == "failed" else None
            if again is not None:
                assert again.is_error
            else:
                assert (await refused(client, "boom", {})).code == -41005

    run(session)
    assert counter.count("boom") == (2 if expected == "failed" else 1)


def test_fail_closed_inputs(site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter))

    async def session() -> None:
        async with connect("stdio", "legacy", command, env=site.env()) as client:
            unknown = await refused(client, "nuke", {})
            assert unknown.code == -41001 and unknown.data["reason"] == "unknown_action"
            floating = await refused(client, "refund", {"order_id": "1", "amount_cents": 1.5})
            assert floating.code == -41008 and floating.data["pointer"] == "/amount_cents"
            await client.list_tools()
            bad = await refused(client, "refund", {"order_id": "1", "amount_cents": "12"})
            assert bad.code == -32602 and "/amount_cents" in bad.message  # pre-flight against the listed schema

    run(session)
    assert counter.count() == 0
    assert site.results() == ["denied"]


def test_raw_messages_that_are_refused_are_never_forwarded(site: Site, counter: Counter) -> None:
    with RawStdio(site.gateway(upstream_stdio_command(counter)), env=site.env()) as raw:
        raw.send('{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}')
        assert json.loads(raw.receive())["error"]["code"] == -32700
        raw.send('[{"jsonrpc":"2.0","id":3,"method":"ping"}]')
        assert json.loads(raw.receive())["error"]["code"] == -32600
        raw.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "refund", "arguments": {"order_id": "1", "amount_cents": 1},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "1999-01-01"}}})  # fmt: skip
        assert json.loads(raw.receive())["error"]["code"] == -32022
        assert raw.close() == 0
    assert counter.count() == 0


def test_no_principal_is_refused_at_start(site: Site, counter: Counter) -> None:
    result = invoke(["gateway", "--alias", "pay", "--policy", str(site.policy), "--",
                     *upstream_stdio_command(counter)])  # fmt: skip
    assert result.code == 1 and "principal" in result.err


def test_the_upstream_receives_the_token(site: Site, counter: Counter) -> None:
    command = site.gateway(upstream_stdio_command(counter))

    async def session() -> None:
        async with connect("stdio", "legacy", command, env=site.env()) as client:
            await client.call_tool("refund", {"order_id": "1", "amount_cents": 1})

    run(session)
    (line,) = counter.executions("refund")
    assert line["token"] and TOKEN_KEY
