"""How a protected call records the refusals its start meets: a spent or wrong approval, a
denied one, a key that is taken or ambiguous (each with its events and a receipt), and the same
refusals judged before a human is asked about a call that could not run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attempt import Attempt
from .preconditions import invalidated_data
from .steps import Steps, call
from ..effects.records import LAPSED_LEASE_ERROR, EffectState, plan_reservation
from ..errors import ActionDenied, AmbiguousEffect, ApprovalMismatch, CTRLRunError, DuplicateEffect, InvalidArgument
from ..evidence.receipt import Event, EventType

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = ["reservation_event", "refuse_approval", "refuse_denied_approval", "refuse_reservation", "refuse_before_asking"]

_APPROVAL_ERRORS = {
    "mismatch": "approval {id} is bound to another action (mismatch)",
    "consumed": "approval {id} was already used (consumed)",
    "expired": "approval {id} expired before it was used (expired)",
    "pending": "approval {id} has not been granted yet (pending)",
    "unknown": "no approval request {id} (unknown)",
    "precondition_changed": "approval {id} was granted for another state of the resource "
    "(precondition_changed)",
    "precondition_missing": "approval {id} and this call disagree on a precondition: one of "
    "them has none (precondition_missing)",
    "precondition_unavailable": "approval {id} could not be rechecked: the precondition "
    "provider failed ({error}) (precondition_unavailable)",
}


def refuse_approval(wiring: Wiring, attempt: Attempt, refusal: ApprovalMismatch) -> Steps[None]:
    """A presented approval the store would not spend: its events and a ``blocked`` receipt."""
    if refusal.reason == "expired":
        attempt.event(EventType.APPROVAL_EXPIRED)
    attempt.event(
        EventType.APPROVAL_INVALIDATED,
        reason=refusal.reason,
        action_hash=attempt.action.action_hash,
        **invalidated_data(attempt, refusal.reason),
    )
    attempt.approver = yield from wiring.approver_of(attempt.approval_id)
    attempt.attempt = yield from wiring.attempt_number(attempt.effect_key)
    error = _APPROVAL_ERRORS.get(refusal.reason, "approval {id} refused ({reason})")
    yield from wiring.record(
        attempt,
        attempt.receipt("blocked", error.format(id=attempt.approval_id, reason=refusal.reason,
                                               error=attempt.precondition_error)),
    )


def refuse_denied_approval(wiring: Wiring, attempt: Attempt, refusal: ActionDenied) -> Steps[None]:
    """A presented approval a human denied: its events and a ``denied`` receipt."""
    approver = yield from wiring.approver_of(attempt.approval_id)
    attempt.approver = approver
    attempt.event(EventType.APPROVAL_DENIED, approver=approver)
    attempt.event(EventType.ACTION_DENIED, reason="approval_denied")
    attempt.attempt = yield from wiring.attempt_number(attempt.effect_key)
    yield from wiring.record(
        attempt,
        attempt.receipt("denied", f"approval {attempt.approval_id} was denied by {approver}"),
    )
    refusal.action_id = attempt.action.action_id


def reservation_event(attempt: Attempt, refusal: CTRLRunError) -> Event:
    """The ``EFFECT_RESERVATION_REFUSED`` event of a key that is taken or ambiguous."""
    if isinstance(refusal, DuplicateEffect):
        return attempt.new_event(EventType.EFFECT_RESERVATION_REFUSED, reason="duplicate", state=refusal.state)
    return attempt.new_event(EventType.EFFECT_RESERVATION_REFUSED, reason="ambiguous")


def refuse_reservation(
    wiring: Wiring, attempt: Attempt, refusal: CTRLRunError, *, state: str | None
) -> Steps[None]:
    """A key that is taken (``state``) or ambiguous (``None``): the event, a ``blocked`` receipt."""
    key = attempt.effect_key
    attempt.pending.append(reservation_event(attempt, refusal))
    if state is None:
        error = f"effect {key} may already have happened (ambiguous); blind retry refused"
    else:
        error = (
            f"effect {key} already committed (duplicate)"
            if state == "committed"
            else f"effect {key} is held by another attempt (in_progress)"
        )
    if attempt.approval_id:
        attempt.approver = yield from wiring.approver_of(attempt.approval_id)
    attempt.attempt = yield from wiring.attempt_number(key)
    yield from wiring.record(attempt, attempt.receipt("blocked", error))


def refuse_before_asking(wiring: Wiring, attempt: Attempt, lease: Any, *, again: bool = True) -> Steps[None]:
    """Refuse, as the reservation would, a call whose key cannot be reserved now (committed,
    ambiguous, held by a live attempt, or an execution whose lease lapsed, which becomes
    ambiguous), so that no human is asked about it; nothing else is written but the refusal's
    events and receipt."""
    key = attempt.effect_key
    if key is None:
        return
    record = yield call(wiring.store.get_effect, key)
    plan = plan_reservation(record, key, attempt.action.action_id, lease, wiring.clock(),
                            state=EffectState.EXECUTING, action_hash=attempt.action.action_hash)  # fmt: skip
    if plan.kind not in ("refuse", "keep_then_refuse"):
        return
    refusal = plan.error
    assert refusal is not None and record is not None
    if plan.kind == "keep_then_refuse":  # an execution whose lease lapsed: ambiguous, as reserving makes it
        try:
            yield call(wiring.store.mark_ambiguous, key, record.action_id, LAPSED_LEASE_ERROR)
        except (InvalidArgument, DuplicateEffect, AmbiguousEffect):  # the holder finished meanwhile
            if not again:
                raise
            yield from refuse_before_asking(wiring, attempt, lease, again=False)  # judge it once more
            return
    if isinstance(refusal, DuplicateEffect):
        yield from refuse_reservation(wiring, attempt, refusal, state=refusal.state)
    else:
        assert isinstance(refusal, AmbiguousEffect)
        yield from refuse_reservation(wiring, attempt, refusal, state=None)
    raise refusal
