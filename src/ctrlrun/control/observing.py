"""Observe mode's side of the pipeline's checks: each refusal is recorded as enforce mode records
its events, the first one becomes the receipt's ``blocked_reason``, and the call goes on.

The order of the checks is the pipeline's own (``pipeline.run``); these are the steps whose
observing form does something other than refuse: read an approval instead of spending it, check
budgets against the ledger instead of charging them, reserve whatever would have refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .attempt import Attempt, storable
from ..authority.ledger import Charge, first_exhausted
from .preconditions import invalidated_data, recheck
from .refusals import reservation_event
from .options import _Options
from .steps import Steps, call
from ..approvals.records import check_consumable
from ..effects.records import EffectState, plan_reservation
from ..errors import ActionDenied, AmbiguousEffect, ApprovalMismatch, DuplicateEffect
from ..evidence.receipt import EventType

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = [
    "note", "note_if", "observe_approval", "observe_asking", "observe_budgets", "observe_start", "observe_unmeasurable",
]


def note(attempt: Attempt, reason: str) -> bool:
    """Keep ``reason`` as the run's ``blocked_reason`` if nothing refused it earlier; ``True``
    when it did become the one."""
    if attempt.blocked_reason is None:
        attempt.blocked_reason = reason
        return True
    return False


def note_if(attempt: Attempt, reason: str) -> bool:
    """Observing: note ``reason`` and answer ``True`` (go on); enforcing: ``False`` (refuse)."""
    if attempt.observing:
        note(attempt, reason)
        return True
    return False


def _reason_of(refusal: DuplicateEffect | AmbiguousEffect) -> str:
    if isinstance(refusal, DuplicateEffect):
        return "duplicate" if refusal.state == "committed" else "in_progress"
    return "ambiguous"


def observe_asking(wiring: Wiring, attempt: Attempt, options: _Options) -> Steps[None]:
    """An approval nobody presented: no request is made; what enforce would refuse first (the
    key, as it is now, then the approval itself) is noted."""
    key = attempt.effect_key
    if key is not None:
        record = yield call(wiring.store.get_effect, key)
        plan = plan_reservation(record, key, attempt.action.action_id, options.lease, wiring.clock(),
                                state=EffectState.EXECUTING, action_hash=attempt.action.action_hash)  # fmt: skip
        if plan.kind in ("refuse", "keep_then_refuse") and plan.error is not None:
            assert isinstance(plan.error, (DuplicateEffect, AmbiguousEffect))
            note(attempt, _reason_of(plan.error))
    note(attempt, "approval_required")


def observe_approval(wiring: Wiring, attempt: Attempt, approval_id: str, options: _Options) -> Steps[None]:
    """A presented approval, checked (and its precondition rechecked) by a read and never spent:
    a failure writes the events enforce would, and is noted."""
    action = attempt.action
    try:
        record = yield call(wiring.store.get_approval, approval_id)
        now = getattr(wiring.store, "clock", wiring.clock)()
        kept = check_consumable(record, approval_id, action.action_hash, now, action_id=action.action_id)
        if kept is not None:
            raise kept.error
        yield from recheck(wiring, attempt, approval_id, options.preconditions)
        assert record is not None
        attempt.approver = record.approver
    except ApprovalMismatch as refusal:
        if refusal.reason == "expired":
            attempt.event(EventType.APPROVAL_EXPIRED)
        attempt.event(EventType.APPROVAL_INVALIDATED, reason=refusal.reason,
                      action_hash=action.action_hash, **invalidated_data(attempt, refusal.reason))  # fmt: skip
        note(attempt, refusal.reason)
    except ActionDenied as refusal:  # a human denied it
        attempt.event(EventType.APPROVAL_DENIED, approver=record.approver if record else None)
        note(attempt, refusal.reason)


def observe_start(wiring: Wiring, attempt: Attempt, options: _Options) -> Steps[Any]:
    """Reserve the key whatever would have refused the call; a refused reservation is recorded
    and the function runs holding nothing (``attempt.holding`` False)."""
    key = attempt.effect_key
    if key is None:
        attempt.holding = False
        attempt.pending.append(attempt.started())
        return None

    def started(approval: Any, reservation: Any) -> list[Any]:
        events = list(attempt.pending)
        if reservation is not None:
            events.append(attempt.reserved(reservation))
        events.append(attempt.started())
        return events

    from .attempt import fan_out

    try:
        _, reservation, stored = yield call(
            wiring.store.start_attempt, action_id=attempt.action.action_id, effect_key=key,
            lease=options.lease, action_hash=attempt.action.action_hash, events=started,
            return_events=bool(wiring.sinks),
        )  # fmt: skip
    except (DuplicateEffect, AmbiguousEffect) as refusal:
        attempt.pending.append(reservation_event(attempt, refusal))
        note(attempt, _reason_of(refusal))
        attempt.holding = False
        attempt.attempt = 1
        attempt.pending.append(attempt.started())
        return None
    attempt.pending.clear()
    fan_out(wiring.sinks, stored, None)
    return reservation


def observe_budgets(wiring: Wiring, attempt: Attempt, charges: Sequence[Charge]) -> Steps[None]:
    """The budgets checked against the ledger as it is, nothing charged; a charge that would not
    fit is noted (and, when it is the run's first refusal, denied in an event marked observed)."""
    if not charges:
        return
    now = wiring.clock()
    spent: dict[tuple[str, str, int], int] = {}
    for charge in charges:
        rows = yield call(wiring.store.consumptions, grant_id=charge.grant_id, metric=charge.metric,
                          since=now - timedelta(seconds=charge.window))  # fmt: skip
        spent[(charge.grant_id, charge.metric, charge.window)] = sum(
            r.amount for r in rows if r.released_at is None
        )
    exhausted = first_exhausted(charges, lambda g, m, w: spent[(g, m, w)])
    if exhausted is not None and note(attempt, "budget_exhausted"):
        attempt.event(EventType.ACTION_DENIED, reason="budget_exhausted", grant_id=exhausted.grant_id,
                      metric=exhausted.metric, window=exhausted.window, observed=True)  # fmt: skip


def observe_unmeasurable(attempt: Attempt, refusal: ActionDenied) -> None:
    """A budget that cannot measure the call (no key, no usable metric), noted."""
    if note(attempt, refusal.reason):
        attempt.event(EventType.ACTION_DENIED, reason=refusal.reason, error=storable(str(refusal)),
                      observed=True)  # fmt: skip
