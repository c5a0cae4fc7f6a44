"""One attempt's evidence: the events it has yet to write and the receipt it ends with."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._time import Clock, format_ts
from ..action import Action, new_id
from ..evidence.receipt import Event, EventType, Receipt

log = logging.getLogger("ctrlrun")


@dataclass
class Attempt:
    """Collects one attempt's events (written with the next store write) and builds its receipt."""

    action: Action
    effect_key: str | None
    approval_id: str | None
    clock: Clock
    policy_hash: str | None
    policy_version: str | None
    task: str | None = None
    hop: str | None = None
    started_at: str = ""
    decision: str = "deny"
    reason: str = ""
    controls: tuple[str, ...] = ()
    approver: str | None = None
    attempt: int = 1
    edited_from: str | None = None
    edit_diff: dict[str, Any] | None = None
    pending: list[Event] = field(default_factory=list)
    reconciled: bool = False  # the reconcile hook runs at most once per call
    observing: bool = False  # observe mode: refusals are noted, the call goes on
    blocked_reason: str | None = None  # the first refusal enforce mode would have raised
    holding: bool = True  # False: an observed run whose reservation was refused
    authority_grant_id: str | None = None  # the grant that passed, when authority is on
    budget_charges: tuple[Mapping[str, Any], ...] = ()  # the ledger rows the start wrote
    precondition_at_request: str | None = None  # the fingerprint the presented request stores
    precondition_at_recheck: str | None = None  # the fingerprint taken before spending it
    precondition_error: str | None = None  # the type name of the recheck's failure, if it failed

    def __post_init__(self) -> None:
        self.started_at = self.now()

    def now(self) -> str:
        return format_ts(self.clock())

    def event(self, type_: EventType, *, approval_id: str | None = None, **data: Any) -> Event:
        """Queue an event; it is written with this attempt's next store write."""
        event = self.new_event(type_, approval_id=approval_id, **data)
        self.pending.append(event)
        return event

    def new_event(self, type_: EventType, *, approval_id: str | None = None, **data: Any) -> Event:
        """An event of this attempt, not queued (the caller writes it)."""
        return Event(
            type=type_,
            ts=self.now(),
            action_id=self.action.action_id,
            effect_key=self.effect_key,
            approval_id=approval_id or self.approval_id,
            data=data,
        )

    def reserved(self, reservation: Any) -> Event:
        """Take the attempt number the store assigned; the ``EFFECT_RESERVED`` event saying so."""
        self.attempt = reservation.attempt
        return self.new_event(EventType.EFFECT_RESERVED, attempt=reservation.attempt,
                              lease_expires_at=format_ts(reservation.lease_expires_at))  # fmt: skip

    def started(self) -> Event:
        """The ``EXECUTION_STARTED`` event: the function is about to run."""
        return self.new_event(EventType.EXECUTION_STARTED, task=self.task, hop=self.hop)

    def spent(self, approval: Any) -> None:
        """Note the approval this attempt consumed: who answered it, and any edit they made."""
        self.approver = approval.approver
        self.edited_from = approval.edited_from
        self.edit_diff = dict(approval.edit_diff) if approval.edit_diff is not None else None

    def take(self, *extra: Event) -> list[Event]:
        """Hand over the queued events (plus ``extra``) to a store write."""
        events, self.pending = [*self.pending, *extra], []
        return events

    def receipt(self, result: str, error: str | None = None) -> Receipt:
        principal = self.action.principal
        execution = would_have = None
        if self.observing:  # what the function did, and what enforce mode would have done
            execution, result = result, "observed"
            would_have = {"decision": self.decision, "reason": self.reason,
                          "blocked_reason": self.blocked_reason}  # fmt: skip
        return Receipt(
            receipt_id=new_id("ctr"),
            action_id=self.action.action_id,
            action=self.action.name,
            action_hash=self.action.action_hash,
            principal=principal,
            resource=self.action.resource,
            arguments=self.action.canonical_arguments,
            environment=self.action.environment,
            decision=self.decision,
            decision_reason=self.reason,
            approval_id=self.approval_id,
            approver=self.approver,
            effect_key=self.effect_key,
            attempt=self.attempt,
            result=result,
            execution=execution,
            would_have=would_have,
            error=error,
            started_at=self.started_at,
            finished_at=self.now(),
            policy_hash=self.policy_hash,
            policy_version=self.policy_version,
            controls=self.controls,
            precondition_at_request=self.precondition_at_request,
            precondition_at_recheck=self.precondition_at_recheck,
            task=self.task,
            hop=self.hop,
            edited_from=self.edited_from,
            edit_diff=self.edit_diff,
            authority_grant_id=self.authority_grant_id,
            budget_charges=self.budget_charges,
        )


def fan_out(
    sinks: Sequence[Any], events: Sequence[Event], receipt: Receipt | None
) -> None:
    """Copy committed evidence to every sink, each record on its own: a sink that fails on one
    is logged and still gets the next (the action's later events and its receipt)."""
    for sink in sinks:
        batch = getattr(sink, "on_batch", None)
        if batch is not None:
            try:
                batch(events, receipt)
            except Exception:
                _failed(sink)
            continue
        for event in events:
            try:
                sink.on_event(event)
            except Exception:
                _failed(sink)
        if receipt is not None:
            try:
                sink.on_receipt(receipt)
            except Exception:
                _failed(sink)


def _failed(sink: Any) -> None:
    log.warning("event sink %r failed; continuing", sink, exc_info=True)


def describe(exc: BaseException) -> str:
    """``"<TypeName>: <message>"``, made storable (lone surrogates escaped)."""
    return storable(f"{type(exc).__name__}: {message_of(exc)}")


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's own ``__str__`` fails."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose message cannot be shown>"


def storable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def mapping_or_empty(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})
