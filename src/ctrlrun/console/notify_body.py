"""What a webhook is sent: the facts of a request or an effect (never argument values), as the
``json`` document or Slack's ``{"text": …}``, and the HMAC signature of the exact bytes."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from .._time import format_ts
from ..approvals.records import ApprovalRecord
from ..operator.text import safe
from ..errors import InvalidArgument
from ..evidence.receipt import Receipt

__all__ = [
    "APPROVAL_ESCALATED",
    "APPROVAL_REQUESTED",
    "EFFECT_AMBIGUOUS",
    "FORMATS",
    "effect_facts",
    "render",
    "request_facts",
    "signature",
]

APPROVAL_REQUESTED = "approval.requested"
EFFECT_AMBIGUOUS = "effect.ambiguous"
APPROVAL_ESCALATED = "approval.escalated"
FORMATS = ("json", "slack")

_FACTS = ("request_id", "action", "agent", "user", "environment", "effect_key", "expires_at")
_HEADLINE = {
    APPROVAL_REQUESTED: "approval requested",
    EFFECT_AMBIGUOUS: "effect outcome unknown (ambiguous): resolve it",
    APPROVAL_ESCALATED: "approval still pending: escalated",
}


def request_facts(record: ApprovalRecord, effect_key: str | None) -> dict[str, Any]:
    """A request's facts: who asks for which action, where, its effect key and its expiry."""
    action = record.request.action
    return {"request_id": record.approval_id, "action": action.name,
            "agent": action.principal.agent, "user": action.principal.user,
            "environment": action.environment, "effect_key": effect_key,
            "expires_at": format_ts(record.expires_at)}  # fmt: skip


def effect_facts(effect_key: str, receipt: Receipt | None) -> dict[str, Any]:
    """An ambiguous effect's facts, from its newest receipt when there is one."""
    if receipt is None:
        return {"request_id": None, "action": None, "agent": None, "user": None,
                "environment": None, "effect_key": effect_key, "expires_at": None}  # fmt: skip
    principal: Any = receipt.principal
    return {"request_id": receipt.approval_id, "action": receipt.action,
            "agent": principal.agent, "user": principal.user,
            "environment": receipt.environment, "effect_key": effect_key,
            "expires_at": None}  # fmt: skip


def link(kind: str, facts: Mapping[str, Any], base_url: str | None) -> str:
    """The console page that shows it: the request, or the ambiguous effects."""
    if kind == EFFECT_AMBIGUOUS:
        path = "/effects?state=ambiguous"
    else:
        path = f"/requests/{facts['request_id']}"
    return (base_url or "").rstrip("/") + path


def render(kind: str, delivery_id: str, facts: Mapping[str, Any], url: str, fmt: str) -> str:
    """The body text sent for one delivery (the same on every retry)."""
    if fmt == "json":
        document = {"type": kind, "id": delivery_id, **{k: facts[k] for k in _FACTS}, "url": url}
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    if fmt == "slack":
        return json.dumps({"text": _slack_text(kind, facts, url)}, ensure_ascii=False)
    raise InvalidArgument(f"unknown webhook format {fmt!r}; use one of {', '.join(FORMATS)}")


def _slack(value: Any) -> str:
    """Stored text as Slack shows it literally: control characters escaped, ``& < >`` too."""
    text = safe("-" if value is None else value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_text(kind: str, facts: Mapping[str, Any], url: str) -> str:
    lines = [f"ctrlrun: {_HEADLINE[kind]}"]
    if facts.get("action") is not None:
        lines.append(f"action: {_slack(facts['action'])} in {_slack(facts['environment'])}")
        who = _slack(facts["agent"])
        if facts.get("user") is not None:
            who += f" for user {_slack(facts['user'])}"
        lines.append(f"agent: {who}")
    if facts.get("request_id") is not None:
        lines.append(f"request: {_slack(facts['request_id'])}")
    lines.append(f"effect key: {_slack(facts.get('effect_key'))}")
    if facts.get("expires_at") is not None:
        lines.append(f"expires: {_slack(facts['expires_at'])}")
    if url.startswith(("http://", "https://")):
        lines.append(f"<{url}|open in the console>")
    else:
        lines.append(f"console page: {_slack(url)}")
    return "\n".join(lines)


def signature(body: bytes, secret: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body keyed with secret>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
