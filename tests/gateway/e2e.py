"""Shared pieces of the end-to-end gateway tests: the policy, the gateway command, the store."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ctrlrun

SRC = str(Path(ctrlrun.__file__).resolve().parents[1])

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{order_id}"
    rules:
      - when: { amount_cents_lte: 5000 }
        decision: allow
      - decision: approve
  mcp.pay.lookup:
    decision: allow
  mcp.pay.boom:
    effect: "boom"
    decision: allow
  mcp.pay.confirm_delete:
    effect: "delete:{path}"
    decision: allow
"""

FLAGGED = POLICY.replace('''  mcp.pay.boom:
    effect: "boom"
    decision: allow''', '''  mcp.pay.boom:
    effect: "boom"
    decision: allow
    mcp: { not_executed_on_error: true }''')


class Site:
    """A policy file and a SQLite store in one directory, shared by gateways and the CLI."""

    def __init__(self, directory: Path, policy: str = POLICY, store_url: str | None = None) -> None:
        self.directory = directory
        self.policy = directory / "ctrlrun.yaml"
        self.policy.write_text(policy)
        self.db = directory / "state.db"
        self.store_url = store_url or f"sqlite://{self.db}"

    def env(self) -> dict[str, str]:
        """What a gateway subprocess needs (the SDK's stdio client passes on little else)."""
        env = {"PYTHONPATH": SRC, "PATH": os.environ.get("PATH", "")}
        return env

    def gateway(self, upstream: list[str], *extra: str, principal: str = "agent-1") -> list[str]:
        return [sys.executable, "-m", "ctrlrun", "gateway", "--alias", "pay", "--principal", principal,
                "--policy", str(self.policy), "--store-url", self.store_url, *extra, "--", *upstream]  # fmt: skip

    def http_gateway(self, upstream_url: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "ctrlrun", "gateway", "--alias", "pay", "--upstream", upstream_url,
                "--listen", "127.0.0.1:0", "--policy", str(self.policy), "--store-url", self.store_url, *extra]  # fmt: skip

    def receipts(self) -> list[Any]:
        from ctrlrun.store import open_store_url

        store = open_store_url(self.store_url)
        try:
            return [r for r in store.receipts()]
        finally:
            store.close()

    def results(self) -> list[str]:
        return [str(r.result) for r in self.receipts()]


def error_of(exc: BaseException) -> Any:
    """The ``MCPError`` inside whatever the SDK raised (it may come wrapped in a group)."""
    from mcp import MCPError

    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = error_of(inner)
            if found is not None:
                return found
    return None


async def refused(client: Any, tool: str, arguments: dict[str, Any]) -> Any:
    """Call a tool that ctrlrun answers with a JSON-RPC error; return the error."""
    try:
        result = await client.call_tool(tool, arguments)
    except Exception as exc:  # noqa: BLE001 - the SDK's MCPError, maybe grouped
        found = error_of(exc)
        if found is None:
            raise
        return found
    raise AssertionError(f"expected a JSON-RPC error, got {result!r}")
