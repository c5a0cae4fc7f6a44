"""The gateway end to end over streamable HTTP: ``ctrlrun gateway --listen 127.0.0.1:0`` as a
subprocess in front of the real upstream (in-process, uvicorn), spoken to by the SDK's client."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from .._cli_helpers import invoke
from .conftest import MODES, UPSTREAM_SCRIPT, Counter, Mode, confirming, connect
from .e2e import FLAGGED, SRC, Site, refused

RECEIPT = "com.ctrlrun/receipt"
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+/mcp)")
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


class Served:
    """A gateway subprocess serving HTTP; ``url`` is its endpoint."""

    def __init__(self, command: list[str]) -> None:
        env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, env=env, text=True)  # fmt: skip
        self.log: list[str] = []
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            found = LISTENING.search(line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise AssertionError("the gateway did not start:\n" + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture
def gateway() -> Iterator[Any]:
    started: list[Served] = []

    def start(command: list[str]) -> Served:
        served = Served(command)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()




def raw_call(url: str, ident: int, tool: str, arguments: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """One 2026-07-28 tools/call over plain HTTP (no session needed)."""
    body = {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": ENVELOPE}}  # fmt: skip
    sent = {"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json", "Mcp-Method": "tools/call", "Mcp-Name": tool, **(headers or {})}  # fmt: skip
    with httpx2.Client(trust_env=False, timeout=60) as client:
        return client.post(url, content=json.dumps(body), headers=sent)


def _answer(response: Any) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(response.json())


@pytest.mark.parametrize("mode", MODES)
def test_transparency_approval_and_the_principal_header(mode: Mode, site: Site, counter: Counter,
                                                        upstream_http: Any, gateway: Any) -> None:  # fmt: skip
    upstream = upstream_http()
    served = gateway(site.http_gateway(upstream.url, "--principal-header", "X-Agent", "--user-header", "X-User"))
    assert any("from header X-Agent" in line for line in served.log)
    big = {"order_id": "77", "amount_cents": 9000}

    async def session() -> None:
        async with connect("http", mode, served.url, headers={"X-Agent": "agent-1", "X-User": "alice"},
                           elicitation_callback=confirming()) as client:  # fmt: skip
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"refund", "lookup", "boom", "confirm_delete"}
            result = await client.call_tool("refund", {"order_id": "42", "amount_cents": 1250})
            assert result.meta[RECEIPT]["result"] == "committed"
            assert (await client.read_resource("orders://42")).contents
            deleted = await client.call_tool("confirm_delete", {"path": "/tmp/x"})  # elicitation, or input_required
            assert not deleted.is_error and deleted.meta[RECEIPT]["result"] == "committed"
            first = await refused(client, "refund", big)
            assert first.code == -41002
            assert invoke(["approve", first.data["request_id"], "--store-url", site.store_url]).code == 0
            assert (await client.call_tool("refund", big)).meta[RECEIPT]["result"] == "committed"
            assert (await refused(client, "refund", big)).code == -41004

    anyio.run(session)
    assert [e["arguments"]["order_id"] for e in counter.executions("refund")] == ["42", "77"]
    assert [e["confirmed"] for e in counter.executions("confirm_delete")] == [True]
    (line, _) = counter.executions("refund")
    assert line["received"] == '{"amount_cents":1250,"order_id":"42"}' and line["token"]
    principals = {(r.principal["agent"] if isinstance(r.principal, dict) else r.principal.agent) for r in site.receipts()}
    assert principals == {"agent-1"}


@pytest.mark.parametrize("misbehave", ["truncate_after", "html404_after", "html500_after", "invalid_request_after", "drop_after"])
def test_no_usable_answer_after_the_tool_ran_is_ambiguous(misbehave: str, site: Site, counter: Counter,
                                                          upstream_http: Any, gateway: Any) -> None:  # fmt: skip
    upstream = upstream_http(misbehave)
    served = gateway(site.http_gateway(upstream.url, "--principal", "agent-1"))
    first = _answer(raw_call(served.url, 1, "refund", {"order_id": "5", "amount_cents": 100}))
    if misbehave == "invalid_request_after":
        assert first["error"]["code"] == -32600  # the upstream's own answer, relayed
    else:
        assert first["error"]["code"] == -41010, first
        assert first["error"]["data"]["effect_key"] == "refund:5"
    retry = _answer(raw_call(served.url, 2, "refund", {"order_id": "5", "amount_cents": 100}))
    assert retry["error"]["code"] == -41005
    assert counter.count("refund") == 1
    assert site.results() == ["ambiguous", "blocked"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_never_connected_is_failed_and_the_retry_runs(site: Site, counter: Counter, gateway: Any) -> None:
    port = _free_port()
    served = gateway(site.http_gateway(f"http://127.0.0.1:{port}/mcp", "--principal", "agent-1"))
    first = _answer(raw_call(served.url, 1, "refund", {"order_id": "6", "amount_cents": 100}))
    assert first["error"]["code"] == -41011, first
    upstream = subprocess.Popen([sys.executable, str(UPSTREAM_SCRIPT), "--counter", str(counter.path), "--transport", "http",
                                 "--port", str(port)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert upstream.stdout is not None and "listening on" in upstream.stdout.readline()
        again = _answer(raw_call(served.url, 2, "refund", {"order_id": "6", "amount_cents": 100}))
        assert again["result"]["_meta"][RECEIPT]["result"] == "committed", again
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
    assert counter.count("refund") == 1
    assert site.results() == ["failed", "committed"]


@pytest.mark.parametrize(("policy", "code"), [(None, -41010), (FLAGGED, -41011)])
def test_an_upstream_challenge_is_not_relayed(policy: str | None, code: int, tmp_path: Path, counter: Counter,
                                              upstream_http: Any, gateway: Any) -> None:  # fmt: skip
    site = Site(tmp_path) if policy is None else Site(tmp_path, policy)
    upstream = upstream_http("challenge")
    served = gateway(site.http_gateway(upstream.url, "--principal", "agent-1"))
    response = raw_call(served.url, 1, "boom", {})
    assert response.status_code == 200 and "www-authenticate" not in response.headers
    assert _answer(response)["error"]["code"] == code


def test_fail_closed_over_http(site: Site, counter: Counter, upstream_http: Any, gateway: Any) -> None:
    upstream = upstream_http()
    served = gateway(site.http_gateway(upstream.url, "--principal-header", "X-Agent"))
    nobody = _answer(raw_call(served.url, 1, "refund", {"order_id": "1", "amount_cents": 1}))
    assert nobody["error"]["code"] == -41007
    assert raw_call(served.url, 2, "refund", {"order_id": "1", "amount_cents": 1},
                    headers={"X-Agent": "a", "Origin": "http://evil.example"}).status_code == 403  # fmt: skip
    with httpx2.Client(trust_env=False, timeout=60) as client:
        rebound = client.post(served.url, content=b"{}", headers={"Host": "evil.example", "Content-Type": "application/json"})
    assert rebound.status_code == 403
    unknown = _answer(raw_call(served.url, 3, "nuke", {}, headers={"X-Agent": "a"}))
    assert unknown["error"]["code"] == -41001
    assert counter.count() == 0
    assert site.results() == ["denied"]
