"""One intercepted ``tools/call``: from the client's message to the answer the client gets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..action import Principal
from .outcome import Observation

__all__ = ["Forward", "Interceptor", "Reply"]

#: Sends the (rewritten) request upstream and answers what the gateway observed. A transport
#: relays anything the upstream sends before its answer (notifications, server-to-client
#: requests, SSE events) to the client itself, and returns only the final observation.
Forward = Callable[[dict[str, Any]], Observation]
#: Sends one JSON-RPC message to the client that made this request.
Reply = Callable[[dict[str, Any]], None]


class Interceptor:
    """Runs each ``tools/call`` through the Control's pipeline (execute = forward)."""

    def call(
        self,
        message: dict[str, Any],
        *,
        principal: Principal | str | None,
        revision: str | None,
        forward: Forward,
        reply: Reply,
    ) -> None:
        """Handle one ``tools/call`` request (already strict-parsed): refuse it, or forward it
        once and classify what came back. Calls ``reply`` with the client's answer (at most once
        for the request, nothing when the client cancelled). ``principal`` is the configured or
        header principal, ``None`` when there is none, or a string saying why none is usable
        (an identity header sent twice). Blocks until the call is settled."""
        raise NotImplementedError
