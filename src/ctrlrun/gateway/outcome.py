"""What a forwarded ``tools/call`` came to, decided only from what the gateway itself observed.

A transport reports one ``Observation``; ``classify`` turns it into a ``Verdict``. Nothing the
upstream says proves that a tool did not run, unless the policy's ``not_executed_on_error`` says
so for that action, and then only for an answer that reports failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..transport import Transport
from .wire import ENVELOPE_REVISION

__all__ = [
    "Answered",
    "Broken",
    "Cancelled",
    "Challenged",
    "NeverConnected",
    "Observation",
    "Verdict",
    "classify",
]


@dataclass(frozen=True)
class NeverConnected:
    """The request never left: the child had exited before it was written, or the call's own
    connection was never established."""

    detail: str


@dataclass(frozen=True)
class Answered:
    """The upstream's strict JSON-RPC response to the forwarded request (its own id)."""

    message: dict[str, Any]


@dataclass(frozen=True)
class Challenged:
    """HTTP 401, or 403 with ``WWW-Authenticate``, without a JSON-RPC body."""

    status: int


@dataclass(frozen=True)
class Broken:
    """Anything else that left no usable answer: a bad status, a non-strict body, a wrong id, a
    stream that ended early, a reset, a timeout, a child that exited first."""

    transport: Transport
    detail: str


@dataclass(frozen=True)
class Cancelled:
    """The client cancelled the call or closed its stream."""

    detail: str = "the client cancelled the call"


Observation = NeverConnected | Answered | Challenged | Broken | Cancelled


@dataclass(frozen=True)
class Verdict:
    """``state``: ``committed``, ``failed``, ``ambiguous`` or ``waiting`` (the upstream asks for
    more input). ``relay`` is the upstream's answer to pass on unchanged, else ``None`` (the
    gateway answers with its own error). ``detail`` says why, for the record; ``silent``: the
    client cancelled, so it gets nothing."""

    state: str
    relay: dict[str, Any] | None
    detail: str
    silent: bool = False


def classify(observation: Observation, *, revision: str | None, not_executed_on_error: bool = False) -> Verdict:
    """The outcome of one forwarded call (see the module docstring for the rule)."""
    failure = "failed" if not_executed_on_error else "ambiguous"
    if isinstance(observation, NeverConnected):
        return Verdict("failed", None, f"never connected: {observation.detail}")
    if isinstance(observation, Challenged):
        return Verdict(failure, None, f"the upstream answered HTTP {observation.status} without a JSON-RPC body")
    if isinstance(observation, Broken):
        return Verdict("ambiguous", None, observation.detail)
    if isinstance(observation, Cancelled):
        return Verdict("ambiguous", None, observation.detail, silent=True)
    message = observation.message
    if "error" in message:
        code = message["error"].get("code") if isinstance(message["error"], dict) else None
        return Verdict(failure, message, f"the upstream answered a JSON-RPC error ({code})")
    result = message.get("result")
    if not isinstance(result, dict):
        return Verdict("ambiguous", message, "the upstream's result is not an object")
    result_type = result.get("resultType")
    if result_type == "input_required":
        return Verdict("waiting", message, "the upstream asks for more input")
    if result_type is None and revision == ENVELOPE_REVISION:
        return Verdict("ambiguous", message, f"the upstream's result has no resultType on {revision}")
    if result_type is not None and result_type != "complete":
        return Verdict("ambiguous", message, f"the upstream's result has resultType {str(result_type)[:40]!r}")
    if result.get("isError") is True:
        return Verdict(failure, message, "the tool reported an error (isError)")
    if result.get("isError") not in (None, False):
        return Verdict("ambiguous", message, "the upstream's isError is not a boolean")
    return Verdict("committed", message, "the tool answered a result")


#: Sends the (rewritten) request upstream and answers what the gateway observed. A transport
#: relays anything the upstream sends before its answer (notifications, server-to-client
#: requests, SSE events) to the client itself, and returns only the final observation.
Forward = Callable[[dict[str, Any]], Observation]
#: Sends one JSON-RPC message to the client that made this request.
Reply = Callable[[dict[str, Any]], None]
