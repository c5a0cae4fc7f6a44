"""``mcp-operator``: serve approvals and ambiguous effects to the approver's own assistant over MCP."""

from __future__ import annotations

import click

from ..errors import CTRLRunError, MissingDependency
from ..settings import selects_store
from .stores import Settings, open_operator_store

__all__ = ["mcp_operator"]

_SDK_MODULES = frozenset({"mcp", "mcp_types"})


@click.command("mcp-operator")
@click.option("--store-url", metavar="URL", default=None,
              help="Store to answer in: sqlite://<path> or postgresql://…[?ctrlrun_schema=NAME] "
                   "(default: $CTRLRUN_STORE_URL, $CTRLRUN_STATE, else .ctrlrun/state.db beside "
                   "$CTRLRUN_CONFIG; one of them is required).")  # fmt: skip
@click.pass_obj
def mcp_operator(settings: Settings, store_url: str | None) -> None:
    """Serve approvals and ambiguous effects over MCP on stdio, for your own assistant's host.

    Every answer is confirmed by you through the host's elicitation prompt and recorded as
    mcp-operator:local; the store is never created or migrated.
    """
    if store_url is None and not selects_store():
        raise CTRLRunError(
            "mcp-operator needs an explicit store and found none: pass --store-url URL, or set "
            "CTRLRUN_STORE_URL, CTRLRUN_STATE or CTRLRUN_CONFIG (the store beside that policy); "
            "nothing was started"
        )
    try:
        from ..gateway.operator import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] in _SDK_MODULES:
            raise MissingDependency(module="mcp", extra="mcp") from None
        raise
    with open_operator_store(settings, store_url) as store:
        serve(store, clock=settings.clock)
