"""One action's whole story (the action, its decisions, the approval request and its answers, the
effect and its attempts, the receipts), read by index only: what ``ctrlrun inspect ID`` prints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._time import format_ts
from ..errors import CTRLRunError
from ..evidence.receipt import Event, EventType, Receipt, UnreadableReceipt
from ..store import StateStore

__all__ = ["KINDS", "inspect_story"]

KINDS = "an action id (act_…), a request id (apr_…), a receipt id (ctr_…) or an effect key"
_HISTORY = {
    EventType.APPROVAL_REQUESTED: "requested", EventType.APPROVAL_GRANTED: "granted",
    EventType.APPROVAL_EDITED: "edited", EventType.APPROVAL_DENIED: "denied",
    EventType.APPROVAL_CONSUMED: "consumed", EventType.APPROVAL_EXPIRED: "expired",
    EventType.APPROVAL_INVALIDATED: "invalidated", EventType.APPROVAL_ESCALATED: "escalated",
}  # fmt: skip
Row = Receipt | UnreadableReceipt


def _kind(ident: str) -> str:
    for prefix, kind in (("act_", "action"), ("apr_", "request"), ("ctr_", "receipt")):
        if ident.startswith(prefix):
            return kind
    return "effect"


def _not_found(ident: str, kind: str) -> CTRLRunError:
    what = "effect key" if kind == "effect" else kind
    return CTRLRunError(
        f"{what} {ident} not found in this store; inspect takes {KINDS}"
    )


class _Story:
    """What the lookups found so far, each record once."""

    def __init__(self) -> None:
        self.receipts: dict[str, Row] = {}
        self.events: dict[int, Event] = {}
        self.actions: list[str] = []
        self.requests: list[str] = []
        self.keys: list[str] = []

    def add(self, receipts: Iterable[Row] = (), events: Iterable[Event] = ()) -> None:
        for row in receipts:
            self.receipts.setdefault(str(row.receipt_id), row)
            if isinstance(row, Receipt):
                self._note(row.action_id, row.approval_id, row.effect_key)
        for event in events:
            self.events.setdefault(int(event.event_id or 0), event)
            self._note(event.action_id, event.approval_id, event.effect_key)

    def _note(self, action_id: Any, approval_id: Any, effect_key: Any) -> None:
        for value, found in ((action_id, self.actions), (approval_id, self.requests),
                             (effect_key, self.keys)):  # fmt: skip
            if isinstance(value, str) and value and value not in found:
                found.append(value)


def inspect_story(store: StateStore, ident: str) -> list[dict[str, Any]]:
    """The documents ``inspect --json`` prints for ``ident``; ``CTRLRunError`` naming it when
    the store holds nothing under it. Every read is an indexed lookup."""
    kind = _kind(ident)
    story = _Story()
    record = effect = None
    if kind == "receipt":
        story.add(receipts=store.receipts_for(receipt_id=ident))
    elif kind == "action":
        story.add(store.receipts_for(action_id=ident), store.events_for(action_id=ident))
    elif kind == "request":
        record = store.get_approval(ident)
        story.add(store.receipts_for(approval_id=ident), store.events_for(approval_id=ident))
        if record is not None and record.request.action.action_id not in story.actions:
            story.actions.insert(0, record.request.action.action_id)
    else:
        effect = store.get_effect(ident)
        story.add(receipts=store.receipts_for(effect_key=ident))
        if effect is not None and effect.action_id not in story.actions:
            story.actions.append(effect.action_id)
        story.keys = [ident]
    if not (story.receipts or story.events or story.actions or record or effect):
        raise _not_found(ident, kind)
    for action_id in list(story.actions):  # each action's own events and receipts
        story.add(store.receipts_for(action_id=action_id), store.events_for(action_id=action_id))
    read = set(story.actions)
    for request_id in story.requests:
        story.add(events=store.events_for(approval_id=request_id))
    for action_id in [a for a in story.actions if a not in read]:  # the action that asked
        story.add(store.receipts_for(action_id=action_id), store.events_for(action_id=action_id))
    records = {
        request_id: record if record is not None and record.approval_id == request_id
        else store.get_approval(request_id)
        for request_id in story.requests
    }  # fmt: skip
    asked = [r.request for r in records.values() if r is not None]
    documents = [_action(story, a, asked) for a in story.actions]
    for request_id in story.requests:
        documents.append(_request(story, request_id, records[request_id]))
    for key in story.keys[:1]:
        documents.append(_effect(story, key, effect if effect is not None else store.get_effect(key)))
    rows = sorted(story.receipts.values(), key=lambda r: (r.seq is None, r.seq or 0))
    documents += [_receipt(row) for row in rows]
    return documents


def _mine(story: _Story, **match: str) -> list[Event]:
    return [e for _, e in sorted(story.events.items())
            if all(getattr(e, k) == v for k, v in match.items())]  # fmt: skip


def _principal(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {"agent": value.get("agent"), "user": value.get("user")}
    return {"agent": value.agent, "user": value.user}


def _action(story: _Story, action_id: str, asked: list[Any]) -> dict[str, Any]:
    """An action's document, from its receipts, or (an action still waiting for a human, or
    one whose receipts were pruned) from the request that holds it."""
    receipts = [r for r in story.receipts.values() if isinstance(r, Receipt) and r.action_id == action_id]
    events = _mine(story, action_id=action_id)
    document: dict[str, Any] = {"kind": "action", "action_id": action_id, "action": None,
                                "arguments": None, "action_hash": None, "principal": None}  # fmt: skip
    requests = [r for r in asked if r.action.action_id == action_id]
    requested = requests[0].action if requests else None
    if receipts:
        first = receipts[0]
        document.update(action=first.action, arguments=dict(first.arguments),
                        action_hash=first.action_hash, principal=_principal(first.principal))  # fmt: skip
    elif requested is not None:
        document.update(action=requested.name, arguments=requested.canonical_arguments,
                        action_hash=requested.action_hash, principal=_principal(requested.principal))  # fmt: skip
    for event in events:
        if event.type is EventType.ACTION_PROPOSED and document["action_hash"] is None:
            document["action_hash"] = event.data.get("action_hash")
    policy_hashes = {r.policy_hash for r in receipts if r.policy_hash}
    if not receipts:
        policy_hashes |= {r.policy_hash for r in requests if r.policy_hash}
    policy_hash = next(iter(policy_hashes)) if len(policy_hashes) == 1 else None
    decisions = []
    for event in events:
        if event.type in (EventType.POLICY_EVALUATED, EventType.ACTION_DENIED):
            reason = event.data.get("reason")
            rule = reason if isinstance(reason, str) and reason.startswith("rule[") else None
            decisions.append({"decision": event.data.get("decision", "deny"), "rule": rule,
                              "reason": reason, "policy_hash": policy_hash, "at": event.ts})  # fmt: skip
    if not decisions:  # a receipt whose events are gone still says what was decided
        decisions = [{"decision": str(r.decision), "rule": None, "reason": r.decision_reason,
                      "policy_hash": r.policy_hash, "at": r.finished_at} for r in receipts]  # fmt: skip
    document["decisions"] = decisions
    return document


def _request(story: _Story, request_id: str, record: Any) -> dict[str, Any]:
    history = [{"what": _HISTORY[e.type], "by": e.data.get("approver") or e.data.get("by"),
                "at": e.ts, "action_id": e.action_id}
               for e in _mine(story, approval_id=request_id) if e.type in _HISTORY]  # fmt: skip
    document: dict[str, Any] = {"kind": "request", "request_id": request_id, "status": None}
    if record is not None:
        action = record.request.action
        document.update(
            status=record.status.value, action_id=action.action_id, action=action.name,
            arguments=action.canonical_arguments, principal=_principal(action.principal),
            action_hash=record.request.action_hash, bound_hash=record.action_hash,
            policy_hash=record.request.policy_hash, approver=record.approver,
            created_at=format_ts(record.request.created_at),
            expires_at=format_ts(record.expires_at),
        )  # fmt: skip
    document["history"] = history
    return document


def _effect(story: _Story, key: str, record: Any) -> dict[str, Any]:
    attempts = [{"attempt": r.attempt, "action_id": r.action_id, "result": str(r.result),
                 "decision": str(r.decision), "receipt_id": r.receipt_id}
                for r in sorted(story.receipts.values(), key=lambda r: r.seq or 0)
                if isinstance(r, Receipt) and r.effect_key == key]  # fmt: skip
    document: dict[str, Any] = {"kind": "effect", "effect_key": key, "state": "new"}
    if record is not None:
        document.update(state=record.state.value, attempt=record.attempt,
                        action_id=record.action_id, updated_at=format_ts(record.updated_at),
                        resolved_by=record.resolved_by)  # fmt: skip
    document["attempts"] = attempts
    return document


def _receipt(row: Row) -> dict[str, Any]:
    if isinstance(row, UnreadableReceipt):
        return {"kind": "receipt", "receipt_id": row.receipt_id, "seq": row.seq, "hash": row.hash,
                "result": None, "unreadable": True}  # fmt: skip
    return {"kind": "receipt", "receipt_id": row.receipt_id, "seq": row.seq, "hash": row.hash,
            "result": str(row.result), "decision": str(row.decision), "action_id": row.action_id,
            "effect_key": row.effect_key, "finished_at": row.finished_at}  # fmt: skip
