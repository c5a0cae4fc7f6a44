"""The console's answers: the operator library's grant, deny, edit and resolve with ``via: "console"``
and the four-eyes rule, each refusal worded for the page with its HTTP status and a reason."""

from __future__ import annotations

import json
from typing import Any

from .. import operator
from ..approvals.records import ApprovalRecord, ApprovalStatus
from ..effects.records import EffectRecord
from ..errors import ActionDenied, CTRLRunError, InvalidArgument
from ..policy import Policy
from ..settings import policy_path
from ..store import StateStore

__all__ = ["Refused", "approve", "deny", "edit", "resolve"]

VIA = "console"


class Refused(CTRLRunError):
    """An answer the console refused; nothing was written (``status`` is the HTTP status)."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _expired(request_id: str) -> Refused:
    return Refused(f"expired: approval request {request_id} expired before it was answered; nothing "
                   "was granted (the agent must ask again)", status=409, code="expired")  # fmt: skip


def _refused(store: StateStore, exc: operator.AnswerRefused, approver: str) -> Refused:
    """An operator refusal in the console's words."""
    request_id = exc.subject
    if exc.code == "unknown":
        return Refused(f"no approval request {request_id}; the queue at / lists open requests", status=404, code="unknown")
    if exc.code == "self_approval":
        return Refused(str(exc), status=409, code="self_approval")
    if exc.code == "unknown_argument":
        return Refused(f"{exc}; nothing was granted", status=422, code="unknown_argument")
    record = exc.record if isinstance(exc.record, ApprovalRecord) else None
    if exc.code == "expired" or (record is not None and record.status is ApprovalStatus.EXPIRED):
        return _expired(request_id)
    if record is not None and record.status is not ApprovalStatus.PENDING:
        said = operator.decision_of(store, record)
        linked = f": {said.sentence(approver)}" if said.made_by(approver) else f" is {said.sentence(approver)}"
        return Refused(f"approval request {request_id}{linked}; a request is answered once (nothing was written)",
                       status=409, code=record.status.value)  # fmt: skip
    return Refused(f"approval request {request_id} was not answered: {exc}", status=409, code=exc.code)


def approve(store: StateStore, request_id: str, approver: str, user: str) -> str:
    """Grant ``request_id`` as ``approver``; returns what happened, in a sentence."""
    try:
        answer = operator.grant(store, request_id, approver, via=VIA, user=user)
    except operator.AnswerRefused as exc:
        raise _refused(store, exc, approver) from None
    if answer.approval is None:
        after = answer.record
        return f"recorded {request_id}: {len(after.approvers)} of {after.request.approvals_required} approvals"
    return f"granted {request_id} for {answer.approval.action_hash}"


def deny(store: StateStore, request_id: str, approver: str, user: str, reason: str) -> str:
    """Refuse ``request_id`` as ``approver``, keeping ``reason`` in the denial's event."""
    try:
        operator.deny(store, request_id, approver, reason=reason, via=VIA, user=user)
    except operator.AnswerRefused as exc:
        raise _refused(store, exc, approver) from None
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


def edit(store: StateStore, request_id: str, approver: str, user: str, text: str,
         policy_file: str | None = None) -> str:  # fmt: skip
    """Grant with the edited ``arguments`` (JSON text), re-checked by the agents' policy and bound
    to the edited action's hash; a refused edit leaves the request pending."""
    arguments = parse_arguments(text)
    try:
        answer = operator.edit(store, request_id, approver, arguments, via=VIA, user=user,
                               policy=lambda: Policy.from_file(policy_file or policy_path()))  # fmt: skip
    except operator.AnswerRefused as exc:
        raise _refused(store, exc, approver) from None
    except ActionDenied as exc:
        raise Refused(str(exc), status=422, code="policy_denied") from None
    except InvalidArgument as exc:
        raise Refused(f"{exc}; nothing was granted", status=422, code="invalid_edit") from None
    assert answer.approval is not None
    return f"granted {request_id} with edits for {answer.approval.action_hash}"


def resolve(store: StateStore, effect_key: str, state: str, resolver: str) -> str:
    """Settle an ambiguous effect as ``committed`` or ``failed``, by ``resolver``."""
    try:
        operator.resolve(store, effect_key, state, resolver, via=VIA)
    except operator.ResolveRefused as exc:
        if exc.code == "bad_state":
            raise Refused(str(exc), status=400, code="bad_state") from None
        current = exc.record if isinstance(exc.record, EffectRecord) else None
        if current is None:
            raise Refused(f"no effect {effect_key} in this store; nothing changed", status=404, code="unknown") from None
        message = f"effect {effect_key} is {current.state}, not ambiguous"
        if current.resolved_by:
            message += f" (resolved by {current.resolved_by})"
        raise Refused(message + "; nothing changed", status=409, code=current.state.value) from None
    return f"{effect_key} resolved {state} by {resolver}"
