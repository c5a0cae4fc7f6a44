"""A small payments MCP server (stdio) to put behind ``ctrlrun gateway``.

    ctrlrun gateway --alias pay --policy examples/mcp/ctrlrun.yaml --principal agent:support \\
        -- python examples/mcp/refund_server.py

Two tools: ``lookup(order_id)`` reads an order; ``refund(order_id, amount_cents)`` refunds part of
it (integer minor units, never floats). The "provider" is an in-memory stand-in. The gateway
decides each call first (the policy allows small refunds, holds larger ones for a human, and runs
each order's refund once); this server only does what it is told.
"""

from __future__ import annotations

import argparse


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser.parse_args()


if __name__ == "__main__":  # first: --help needs no MCP SDK installed, and serves nothing
    parse_arguments()  # it takes no options

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

#: The gateway puts this in ``params._meta`` when it holds an effect key: the same token on a
#: retry of the same effect, so a provider that deduplicates can use it as an idempotency key.
TOKEN_KEY = "com.ctrlrun/idempotency_token"

ORDERS: dict[str, dict[str, Any]] = {
    "ord_1001": {"customer": "Ada", "paid_cents": 4200, "currency": "EUR"},
    "ord_1002": {"customer": "Grace", "paid_cents": 12900, "currency": "EUR"},
}
REFUNDS: dict[str, dict[str, Any]] = {}  # idempotency token (or refund id) -> refund

server = MCPServer("refunds", version="1.0")


@server.tool()
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order: customer, amount paid and refunded so far (read-only)."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}")
    refunded = sum(r["amount_cents"] for r in REFUNDS.values() if r["order_id"] == order_id)
    return {"order_id": order_id, **order, "refunded_cents": refunded}


@server.tool()
def refund(order_id: str, amount_cents: Annotated[int, Field(gt=0)], ctx: Context) -> dict[str, Any]:
    """Refund part of an order, in cents."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}")
    token = (ctx.request_context.meta or {}).get(TOKEN_KEY)
    if not isinstance(token, str):
        token = None
    elif token in REFUNDS:
        return REFUNDS[token]  # the same effect, asked again: the first refund, not a second one
    refunded = sum(r["amount_cents"] for r in REFUNDS.values() if r["order_id"] == order_id)
    if refunded + amount_cents > order["paid_cents"]:
        raise ToolError(f"refund of {amount_cents} cents exceeds what is left on {order_id}")
    done = {"refund_id": f"re_{len(REFUNDS) + 1}", "order_id": order_id, "amount_cents": amount_cents,
            "currency": order["currency"]}  # fmt: skip
    REFUNDS[token or done["refund_id"]] = done
    return done


if __name__ == "__main__":
    server.run("stdio")
