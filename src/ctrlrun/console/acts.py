"""The console's answers: the same store calls and events as ``ctrlrun approve``/``deny``/``resolve``,
with ``via: "console"``, the four-eyes rule, and each refusal as an HTTP status and a reason."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .._locations import policy_path
from ..answers import answer_events, resolve_events
from ..approvals import ApprovalRecord, ApprovalStatus
from ..edits import grant_with_edits
from ..effect import EffectState
from ..errors import ActionDenied, ApprovalMismatch, CTRLRunError, InvalidArgument
from ..policy import Policy
from ..store import StateStore
from .queries import decision_of

__all__ = ["Refused", "approve", "deny", "edit", "resolve"]

VIA = "console"


class Refused(CTRLRunError):
    """An answer the console refused; nothing was written (``status`` is the HTTP status)."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _answerable(store: StateStore, request_id: str, approver: str, user: str, now: datetime) -> ApprovalRecord:
    """The pending request, or the refusal: unknown, self-approval, decided, expired."""
    record = store.get_approval(request_id)
    if record is None:
        raise Refused(f"no approval request {request_id}; the queue at / lists open requests",
                      status=404, code="unknown")  # fmt: skip
    if record.request.action.principal.user == user:
        raise Refused(f"self_approval: {approver} asked for {request_id} and cannot answer it; "
                      "another approver must decide it (nothing was written)", status=409, code="self_approval")  # fmt: skip
    if record.status is not ApprovalStatus.PENDING:
        _closed(store, record, approver)
    if now > record.expires_at:
        _expired(request_id)
    return record


def _closed(store: StateStore, record: ApprovalRecord, approver: str) -> None:
    """Refuse answering a decided request, naming who decided it (``you``, to that approver)."""
    if record.status is ApprovalStatus.EXPIRED:
        _expired(record.approval_id)
    decision = decision_of(store, record)
    said = decision.sentence(approver)
    linked = f": {said}" if decision.made_by(approver) else f" is {said}"
    raise Refused(f"approval request {record.approval_id}{linked}; a request is answered once "
                  "(nothing was written)", status=409, code=record.status.value)  # fmt: skip


def _expired(request_id: str) -> None:
    raise Refused(f"expired: approval request {request_id} expired before it was answered; nothing "
                  "was granted (the agent must ask again)", status=409, code="expired")  # fmt: skip


def _mismatch(store: StateStore, request_id: str, approver: str, exc: ApprovalMismatch) -> Refused:
    """The store refused the answer (another approver was first, or it expired meanwhile)."""
    record = store.get_approval(request_id)
    if exc.reason == "expired" or (record is not None and record.status is ApprovalStatus.EXPIRED):
        return Refused(f"expired: approval request {request_id} expired before it was answered; "
                       "nothing was granted", status=409, code="expired")  # fmt: skip
    if record is not None and record.status is not ApprovalStatus.PENDING:
        try:
            _closed(store, record, approver)
        except Refused as refused:
            return refused
    return Refused(f"approval request {request_id} was not answered: {exc}", status=409, code=exc.reason or "refused")


def approve(store: StateStore, request_id: str, approver: str, user: str, now: datetime) -> str:
    """Grant ``request_id`` as ``approver``; returns what happened, in a sentence."""
    record = _answerable(store, request_id, approver, user, now)
    try:
        approval = store.grant_approval(request_id, approver, events=answer_events(approver, via=VIA))
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, approver, exc) from None
    if approval is None:
        after = store.get_approval(request_id) or record
        return f"recorded {request_id}: {len(after.approvers)} of {after.request.approvals_required} approvals"
    return f"granted {request_id} for {approval.action_hash}"


def deny(store: StateStore, request_id: str, approver: str, user: str, now: datetime, reason: str) -> str:
    """Refuse ``request_id`` as ``approver``, keeping ``reason`` in the denial's event."""
    _answerable(store, request_id, approver, user, now)
    extra: dict[str, Any] = {"reason": reason} if reason.strip() else {}
    try:
        store.deny_approval(request_id, approver, events=answer_events(approver, **extra, via=VIA))
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, approver, exc) from None
    return f"denied {request_id}"


def parse_arguments(text: str) -> dict[str, Any]:
    """The edit form's ``arguments`` field: a JSON object, else a 400 refusal."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise Refused(f"the arguments are not JSON ({exc}); nothing was granted", status=400, code="not_json") from None
    if not isinstance(parsed, dict):
        raise Refused(f"the arguments must be a JSON object of names to values, not a JSON "
                      f"{type(parsed).__name__}; nothing was granted", status=400, code="not_object")  # fmt: skip
    return parsed


def _check_names(request_id: str, record: ApprovalRecord, arguments: Mapping[str, Any]) -> None:
    known = record.request.action.canonical_arguments
    new = sorted(name for name in arguments if name not in known)
    if new:
        raise Refused(f"approval request {request_id} ({record.request.action.name}) has no argument "
                      f"{', '.join(repr(n) for n in new)}; its arguments are {', '.join(sorted(known)) or '(none)'}; "
                      "nothing was granted", status=422, code="unknown_argument")  # fmt: skip


def edit(store: StateStore, request_id: str, approver: str, user: str, now: datetime, text: str,
         policy_file: str | None = None) -> str:  # fmt: skip
    """Grant with the edited ``arguments`` (JSON text), re-checked by the agents' policy and bound
    to the edited action's hash; a refused edit leaves the request pending."""
    arguments = parse_arguments(text)
    record = _answerable(store, request_id, approver, user, now)
    _check_names(request_id, record, arguments)
    policy = Policy.from_file(policy_file or policy_path())
    try:
        approval, _ = grant_with_edits(store, request_id, approver, arguments, policy=policy,
                                       events=answer_events(approver, via=VIA))  # fmt: skip
    except ApprovalMismatch as exc:
        raise _mismatch(store, request_id, approver, exc) from None
    except ActionDenied as exc:
        raise Refused(str(exc), status=422, code="policy_denied") from None
    except InvalidArgument as exc:
        raise Refused(f"{exc}; nothing was granted", status=422, code="invalid_edit") from None
    return f"granted {request_id} with edits for {approval.action_hash}"


def resolve(store: StateStore, effect_key: str, state: str, resolver: str) -> str:
    """Settle an ambiguous effect as ``committed`` or ``failed``, by ``resolver``."""
    if state not in (EffectState.COMMITTED.value, EffectState.FAILED.value):
        raise Refused(f"resolve an effect as committed or failed, not {state!r}", status=400, code="bad_state")
    try:
        store.resolve_effect(effect_key, state, resolver, events=resolve_events(resolver, "human", via=VIA))
    except InvalidArgument:
        current = store.get_effect(effect_key)
        if current is None:
            raise Refused(f"no effect {effect_key} in this store; nothing changed", status=404, code="unknown") from None
        message = f"effect {effect_key} is {current.state}, not ambiguous"
        if current.resolved_by:
            message += f" (resolved by {current.resolved_by})"
        raise Refused(message + "; nothing changed", status=409, code=current.state.value) from None
    return f"{effect_key} resolved {state} by {resolver}"
