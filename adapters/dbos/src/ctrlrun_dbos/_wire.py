"""What crosses DBOS: the event and topic names, and the message the answer step is handling."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ctrlrun.errors import InvalidArgument

CHANNEL = "dbos:recv"
"""The approver recorded when the answer names nobody (a channel, not a person)."""

PENDING_EVENT = "ctrlrun.pending"
"""The workflow event holding the pending request (``PendingApproval.to_dict()``)."""

REFUSED_EVENT = "ctrlrun.refused"
"""The workflow event set when an answer was refused (``{"request_id", "refused"}``); it waits on."""

NO_MESSAGE: Any = object()
message: ContextVar[Any] = ContextVar("ctrlrun_dbos_message", default=NO_MESSAGE)
"""The message the answer step hands to ctrlrun's provider, for ``DBOSInterrupt`` to read."""


def topic(request_id: str) -> str:
    """The ``DBOS.recv`` topic a pending request's answer is sent on."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument(f"topic(request_id) needs a request id, got {request_id!r}")
    return "ctrlrun:" + request_id
