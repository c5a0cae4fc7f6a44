"""The event an answer writes with itself, in the answer's own transaction, whoever answers.

A grant writes ``APPROVAL_GRANTED {approver, action_hash}`` (``APPROVAL_EDITED`` with the edit
when the human changed the arguments), a denial ``APPROVAL_DENIED {approver}``, a resolution
``EFFECT_RESOLVED {state, resolver, resolved_by}``. The store's ``grant_approval``,
``deny_approval`` and ``resolve_effect`` take these as ``events=`` and write them atomically with
the answer; a grant still short of its approver threshold writes none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .._time import format_ts
from .records import ApprovalRecord, ApprovalStatus
from ..effects.records import EffectRecord
from ..evidence.receipt import Event, EventType

__all__ = ["AnswerEvents", "ResolveEvents", "answer_events", "resolve_events"]

AnswerEvents = Callable[[ApprovalRecord, datetime], Sequence[Event]]
ResolveEvents = Callable[[EffectRecord, datetime], Sequence[Event]]


def answer_events(approver: str, **extra: Any) -> AnswerEvents:
    """The events of ``approver``'s answer (``extra`` goes last in their data, e.g. ``via``)."""

    def build(record: ApprovalRecord, now: datetime) -> Sequence[Event]:
        data: dict[str, Any]
        if record.status is ApprovalStatus.DENIED:
            kind, data = EventType.APPROVAL_DENIED, {"approver": approver}
        elif record.status is ApprovalStatus.GRANTED:
            approval = record.as_approval()
            if approval.edited_from is not None:
                kind = EventType.APPROVAL_EDITED
                data = {"approver": approver, "action_hash": approval.action_hash,
                        "edited_from": approval.edited_from, "edit_diff": approval.edit_diff}  # fmt: skip
            else:
                kind = EventType.APPROVAL_GRANTED
                data = {"approver": approver, "action_hash": approval.action_hash}
        else:
            return ()  # recorded, below the approver threshold: not an answer yet
        return (Event(type=kind, ts=format_ts(now), action_id=record.request.action.action_id,
                      approval_id=record.approval_id, data={**data, **extra}),)  # fmt: skip

    return build


def resolve_events(resolver: str, resolved_by: str, **extra: Any) -> ResolveEvents:
    """The event of ``resolver`` settling an effect (``resolved_by``: ``human``, ``reconcile``)."""

    def build(record: EffectRecord, now: datetime) -> Sequence[Event]:
        data = {"state": record.state.value, "resolver": resolver, "resolved_by": resolved_by}
        return (Event(type=EventType.EFFECT_RESOLVED, ts=format_ts(now), action_id=record.action_id,
                      effect_key=record.effect_key, data={**data, **extra}),)  # fmt: skip

    return build
