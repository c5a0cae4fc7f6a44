"""Approve with edits: a reviewer fixes the arguments; the fix is re-checked, bound and recorded."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..action import check_value
from .records import Approval, ApprovalRecord, ApprovalStatus
from ..errors import ActionDenied, ApprovalMismatch, InvalidArgument
from ..policy import Decision, Policy

__all__ = ["edited_arguments", "grant_with_edits", "parse_assignments"]


def parse_assignments(assignments: Iterable[str]) -> dict[str, Any]:
    """``["amount=40000", "note=late"]`` → ``{"amount": 40000, "note": "late"}``.

    A value that reads as JSON is taken as JSON (``40000``, ``true``, ``null``, ``["a"]``); any
    other text is a string. Floats are refused, as everywhere.
    """
    parsed: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        if not sep or not name.strip():
            raise InvalidArgument(f"--set {assignment!r}: write NAME=VALUE, e.g. --set amount=40000")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        check_value(value, f"--set {name}")
        parsed[name.strip()] = value
    return parsed


def edited_arguments(
    record: ApprovalRecord, replace_all: Mapping[str, Any] | None, updates: Mapping[str, Any]
) -> dict[str, Any]:
    """The arguments after an edit: ``replace_all`` (or the requested ones), then ``updates``."""
    if replace_all is not None and not isinstance(replace_all, Mapping):
        raise InvalidArgument("edited arguments must be a JSON object of argument names to values")
    base = dict(replace_all) if replace_all is not None else record.request.action.canonical_arguments
    base.update(updates)
    return base


def grant_with_edits(
    store: Any, request_id: str, approver: str, arguments: Mapping[str, Any], *, policy: Policy,
    events: Any = None,
) -> tuple[Approval, ApprovalRecord]:
    """Grant ``request_id`` for the same action with ``arguments`` instead, if the policy allows it.

    A request answered already (granted, denied, consumed, expired) refuses the edit
    (``ApprovalMismatch`` with its status as the reason). The edited action is re-evaluated: a
    ``deny`` refuses the edit (``ActionDenied`` naming the policy's reason; the request stays
    pending). Otherwise the human's approval is bound to the
    edited action's hash; the original arguments can never run on it. ``events`` are the
    grant's (``ctrlrun.answers.answer_events``), written in its transaction.
    """
    record = store.get_approval(request_id)
    if record is None:
        raise ApprovalMismatch(f"no approval request {request_id}", reason="unknown", approval_id=request_id)
    if record.status is not ApprovalStatus.PENDING:  # answered already: nothing to edit
        raise ApprovalMismatch(f"approval request {request_id} is already {record.status.value}",
                               reason=record.status.value, approval_id=request_id)  # fmt: skip
    original = record.request.action
    edited = original.replace(arguments=arguments)
    evaluation = policy.evaluate(edited)
    if evaluation.decision is Decision.DENY:
        raise ActionDenied(
            f"edit refused: {original.name} with {edited.canonical_arguments} is denied by the "
            f"policy ({evaluation.reason}); request {request_id} stays pending",
            reason=evaluation.reason,
            action_id=original.action_id,
        )
    approval = store.grant_approval(request_id, approver, edited_action=edited, events=events)
    return approval, store.get_approval(request_id)
