"""A real MCP server (the SDK's ``MCPServer``) that the gateway tests put behind the gateway.

Run as ``python tests/gateway/upstream.py --counter FILE [--misbehave MODE]
[--transport stdio|http --port N]`` (stdio by default). Every execution of a tool with an
effect appends one JSON line to the counter file, so a test can prove how often a tool ran.
A misbehaving mode lets the tool run (its line is written) and then fails to answer properly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

UPSTREAM_NAME = "ctrlrun-test-upstream"
TOKEN_KEY = "com.ctrlrun/idempotency_token"
#: The header the HTTP misbehaving middleware stamps on each request so a tool can say it ran.
PROBE_HEADER = "x-upstream-probe"
STDIO_MODES = ("exit_after", "garbage_after", "wrong_id_after", "invalid_request_after")
GARBAGE_LINE = "this is not JSON: the tool ran, the answer is lost"
#: The id a ``wrong_id_after`` answer carries instead of the request's.
WRONG_ID = "not-the-request-id"

Ran = Callable[[Context], None]


def canonical(value: Any) -> str:
    """Canonical JSON (keys sorted at every depth, no spaces), as the counter lines are written."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def record(counter: Path, tool: str, ctx: Context, **extra: Any) -> None:
    """Append one execution of ``tool`` to the counter: its wire arguments and idempotency token."""
    raw = ctx.request_context.params or {}
    arguments = raw.get("arguments") or {}
    meta = ctx.request_context.meta or {}
    line = {
        "tool": tool,
        "arguments": arguments,
        # The arguments as serialized in the order they arrived: equal to canonical() when the
        # caller sent canonical arguments.
        "received": json.dumps(arguments, separators=(",", ":"), ensure_ascii=False),
        "token": meta.get(TOKEN_KEY),
        "protocol": ctx.protocol_version,
        **extra,
    }
    # One O_APPEND write per line: upstreams in several processes may share one counter file.
    fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (canonical(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Confirmation(BaseModel):
    """What ``confirm_delete`` asks the user: one boolean."""

    confirm: bool


def ask_to_delete(path: str) -> Elicit[Confirmation]:
    """The question ``confirm_delete`` asks before it acts."""
    return Elicit(f"Delete {path}?", Confirmation)


def build_server(counter: Path, ran: Ran | None = None) -> MCPServer:
    """The upstream server; ``ran(ctx)`` is called after each counted execution (misbehaviour hook)."""
    server = MCPServer(UPSTREAM_NAME, version="1.0")

    def executed(tool: str, ctx: Context, **extra: Any) -> None:
        record(counter, tool, ctx, **extra)
        if ran is not None:
            ran(ctx)

    @server.tool()
    def refund(order_id: str, amount_cents: int, ctx: Context, currency: str = "EUR") -> dict[str, Any]:
        """Refund an order (counted)."""
        executed("refund", ctx)
        return {"refund_id": f"re_{order_id}", "order_id": order_id, "amount_cents": amount_cents,
                "currency": currency}  # fmt: skip

    @server.tool()
    def lookup(order_id: str) -> str:
        """Look an order up (read-only, not counted)."""
        return f"order {order_id}: paid, 4200 EUR"

    @server.tool()
    def boom(ctx: Context) -> str:
        """Count the execution, then fail (an ``isError`` result)."""
        executed("boom", ctx)
        raise ToolError("boom: the tool ran and failed")

    @server.tool()
    def confirm_delete(
        path: str,
        answer: Annotated[ElicitationResult[Confirmation], Resolve(ask_to_delete)],
        ctx: Context,
    ) -> str:
        """Ask the user to confirm (elicitation, or input_required on 2026-07-28), then act (counted)."""
        confirmed = answer.action == "accept" and answer.data.confirm
        executed("confirm_delete", ctx, answer=answer.action, confirmed=confirmed)
        return f"deleted {path}" if confirmed else f"kept {path}"

    @server.resource("orders://{order_id}")
    def order(order_id: str) -> str:
        """An order as a resource."""
        return f"order {order_id}: paid"

    @server.prompt()
    def refund_prompt(order_id: str) -> str:
        """A prompt naming an order."""
        return f"Please refund order {order_id}."

    return server


class _MisbehavingStdout:
    """The stdout the SDK's stdio transport writes to; replaces the answer to a call whose tool ran."""

    def __init__(self, mode: str, armed: set[str]) -> None:
        self.mode = mode
        self.armed = armed

    async def write(self, line: str) -> None:
        message = json.loads(line)
        answered = str(message.get("id")) if "result" in message or "error" in message else None
        if answered is not None and answered in self.armed:
            self.armed.discard(answered)
            if self.mode == "exit_after":
                sys.stderr.write("upstream: exit_after: exiting without answering\n")
                sys.stderr.flush()
                os._exit(3)
            elif self.mode == "garbage_after":
                line = GARBAGE_LINE + "\n"
            elif self.mode == "wrong_id_after":
                line = canonical({**message, "id": WRONG_ID}) + "\n"
            else:  # invalid_request_after
                line = canonical({"jsonrpc": "2.0", "id": message["id"], "error": {
                    "code": -32600, "message": "Invalid request (sent after the tool ran)"}}) + "\n"  # fmt: skip
        sys.stdout.write(line)

    async def flush(self) -> None:
        sys.stdout.flush()


def serve_stdio(counter: Path, misbehave: str | None) -> None:
    """Serve over stdin/stdout, through the SDK's own stdio transport."""
    if misbehave is None:
        build_server(counter).run("stdio")
        return
    if misbehave not in STDIO_MODES:
        raise SystemExit(f"--misbehave {misbehave!r}: over stdio, use one of {', '.join(STDIO_MODES)}")
    armed: set[str] = set()
    server = build_server(counter, lambda ctx: armed.add(ctx.request_id))
    lowlevel = server._lowlevel_server  # noqa: SLF001 - run() with our own stdout
    sys.stdout.reconfigure(encoding="utf-8")  # type: ignore[union-attr]

    async def run() -> None:
        out: Any = _MisbehavingStdout(misbehave, armed)
        async with stdio_server(stdout=out) as (read_stream, write_stream):
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())

    anyio.run(run)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counter", type=Path, required=True)
    parser.add_argument("--misbehave", default=None)
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        serve_stdio(args.counter, args.misbehave)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.gateway.upstream_http import serve_forever  # noqa: PLC0415

        serve_forever(args.counter, args.misbehave, port=args.port)


if __name__ == "__main__":
    main()
