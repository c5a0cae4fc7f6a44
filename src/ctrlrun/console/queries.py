"""What the console's pages show, read from the store and escaped for display with ``safe``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._time import format_ts
from ..action import canonical_bytes
from ..approvals.records import ApprovalRecord, ApprovalStatus
from ..evidence.chain import ChainReport
from ..operator.answers import Decision, decision_of
from ..operator.pending import effect_state, pending_document, requested_key
from ..operator.text import safe
from ..effects.records import EffectState
from ..evidence.receipt import Event, EventType, Receipt, UnreadableReceipt
from ..store import StateStore

__all__ = [
    "Decision", "RequestView", "ambiguous_effects", "api_pending", "decision_of", "effect_keys",
    "pending_rows", "prefill_json", "pretty_json", "receipts_view", "request_view",
]  # fmt: skip

_ANSWERS = (EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EDITED)
_HISTORY = frozenset({*(t.value for t in _ANSWERS), "APPROVAL_REQUESTED", "APPROVAL_CONSUMED",
                      "APPROVAL_EXPIRED", "APPROVAL_INVALIDATED", "APPROVAL_ESCALATED"})  # fmt: skip


def pretty_json(value: Any) -> str:
    """Indented JSON, non-ASCII as itself, then hidden code points shown as ``\\x1b``-style escapes
    (its own line breaks stay: JSON writes those inside strings as ``\\n``)."""
    text = json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False)
    return "\n".join(safe(line) for line in text.split("\n"))


def _json_escape(char: str) -> str:
    point = ord(char)
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    point -= 0x10000
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


def prefill_json(value: Any) -> str:
    """Indented JSON that parses back to ``value`` exactly; each code point the CLI would escape
    is written as a ``\\uXXXX`` escape (they only occur inside strings)."""
    text = json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False)
    if all(safe(line) == line for line in text.split("\n")):
        return text
    return "".join(_json_escape(c) if c != "\n" and safe(c) != c else c for c in text)


def _canonical_text(arguments: Mapping[str, Any]) -> str:
    return safe(canonical_bytes(arguments).decode("utf-8"))


def effect_keys(events: Iterable[Event]) -> dict[str, str | None]:
    """Each request's effect key, as its ``APPROVAL_REQUESTED`` event recorded it."""
    return {e.approval_id: e.effect_key for e in events
            if e.type is EventType.APPROVAL_REQUESTED and e.approval_id is not None}  # fmt: skip


def _blocked(state: str | None) -> bool:
    """Approving cannot run the call: its effect already happened or may have."""
    return state in (EffectState.COMMITTED.value, EffectState.AMBIGUOUS.value)


def _row(record: ApprovalRecord, key: str | None, state: str | None) -> dict[str, Any]:
    action = record.request.action
    return {
        "id": record.approval_id,
        "action": safe(action.name),
        "agent": safe(action.principal.agent),
        "user": safe(action.principal.user) if action.principal.user is not None else "",
        "environment": safe(action.environment),
        "effect_key": safe(key) if key is not None else "",
        "effect_state": state or "",
        "blocked": _blocked(state),
        "created_at": format_ts(record.request.created_at),
        "expires_at": format_ts(record.expires_at),
        "arguments": _canonical_text(action.canonical_arguments),
    }


def pending_rows(store: StateStore) -> list[dict[str, Any]]:
    """The queue, oldest first: pending, unexpired requests with their effect key and its state."""
    rows = []
    for record in store.pending_approvals():
        key = _request_key(store, record.approval_id)
        rows.append(_row(record, key, effect_state(store, key)))
    return rows


def api_pending(store: StateStore) -> list[dict[str, Any]]:
    """The queue as ``pending --json`` documents, with the request's own effect key and its state."""
    documents = []
    for record in store.pending_approvals():
        key = _request_key(store, record.approval_id)
        documents.append(pending_document(record, key, effect_state(store, key)))
    return documents


def _events(store: StateStore, request_id: str) -> Sequence[Event]:
    """One request's events, by the events' approval id index."""
    return store.events_for(approval_id=request_id)


def _request_key(store: StateStore, request_id: str) -> str | None:
    return requested_key(store, request_id)


def _history_entry(event: Event) -> dict[str, Any]:
    data = event.data
    who = data.get("approver") or data.get("resolver")
    diff = data.get("edit_diff")
    return {
        "type": event.type.value,
        "ts": event.ts,
        "by": safe(who) if isinstance(who, str) else "",
        "via": safe(data["via"]) if isinstance(data.get("via"), str) else "",
        "reason": safe(data["reason"]) if isinstance(data.get("reason"), str) else "",
        "diff": pretty_json(diff) if isinstance(diff, Mapping) else "",
    }


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request page's facts, escaped for display."""

    record: ApprovalRecord
    fields: dict[str, Any]
    arguments: str
    prefill: str
    history: list[dict[str, Any]]
    pending: bool
    decision: Decision | None


def request_view(store: StateStore, request_id: str, now: datetime) -> RequestView | None:
    """Everything ``/requests/{id}`` shows, in any status; None for an unknown id."""
    record = store.get_approval(request_id)
    if record is None:
        return None
    action = record.request.action
    mine = [e for e in _events(store, request_id) if e.type.value in _HISTORY]
    evaluated = [e for e in store.events_for(action_id=action.action_id)
                 if e.type is EventType.POLICY_EVALUATED]  # fmt: skip
    reason = evaluated[-1].data.get("reason") if evaluated else None
    key = effect_keys(mine).get(request_id)
    state = effect_state(store, key)
    fields = _row(record, key, state)
    fields.update({
        "status": record.status.value,
        "action_hash": record.request.action_hash,
        "bound_hash": record.action_hash,
        "policy_hash": safe(record.request.policy_hash) if record.request.policy_hash else "",
        "policy_reason": safe(reason) if isinstance(reason, str) else "",
        "resource": safe(action.resource) if action.resource is not None else "",
    })
    pending = record.status is ApprovalStatus.PENDING and now <= record.expires_at
    decision = None if record.status is ApprovalStatus.PENDING else decision_of(store, record)
    return RequestView(
        record=record,
        fields=fields,
        arguments=pretty_json(action.canonical_arguments),
        prefill=prefill_json(action.canonical_arguments),
        history=[_history_entry(e) for e in mine],
        pending=pending,
        decision=decision,
    )


def ambiguous_effects(store: StateStore) -> list[dict[str, Any]]:
    """The effects whose outcome is unknown, oldest first, for a human to settle."""
    return [{
        "key": record.effect_key,
        "shown_key": safe(record.effect_key),
        "action_id": safe(record.action_id),
        "attempt": record.attempt,
        "updated_at": format_ts(record.updated_at),
        "error": safe(record.error) if record.error else "",
    } for record in store.iter_effects(EffectState.AMBIGUOUS)]  # fmt: skip


def _receipt_row(row: Receipt | UnreadableReceipt) -> dict[str, Any]:
    if not isinstance(row, Receipt):
        return {"seq": row.seq, "unreadable": True, "error": safe(row.error)}
    return {
        "seq": row.seq,
        "unreadable": False,
        "finished_at": row.finished_at,
        "action": safe(row.action),
        "result": safe(row.result),
        "decision": safe(row.decision),
        "effect_key": safe(row.effect_key) if row.effect_key else "",
        "approver": safe(row.approver) if row.approver else "",
        "receipt_id": safe(row.receipt_id),
    }


def receipts_view(store: StateStore, limit: int = 100) -> tuple[list[dict[str, Any]], ChainReport]:
    """The most recent receipts (newest first) and the chain's check from the store's verified
    mark (the receipts written since it, so a page costs the new rows; the mark then moves)."""
    from ..store.verifymark import verify_and_mark

    report = verify_and_mark(store, since_verified=True)
    rows = store.last_receipts(limit)
    return [_receipt_row(row) for row in reversed(rows)], report
