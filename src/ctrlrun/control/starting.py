"""The start of a protected call: the presented approval spent, the key reserved and the budget
charged in one store transaction, and each refusal that start meets recorded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .attempt import Attempt, fan_out
from .authorize import charged, refuse_budget
from .ceiling import over_ceiling
from .outcomes import lost_start
from .preconditions import consumed_data, recheck
from .refusals import refuse_approval, refuse_denied_approval, refuse_reservation
from .options import _Options
from .reconciling import reconcile
from .steps import Steps, call
from ..errors import (
    ActionDenied,
    AmbiguousEffect,
    AmbiguousWrite,
    ApprovalMismatch,
    BudgetExhausted,
    DuplicateEffect,
)
from ..evidence.receipt import EventType

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = ["BEFORE_START", "start"]

BEFORE_START = frozenset(
    {
        EventType.ACTION_PROPOSED,
        EventType.AUTHORITY_RESOLVED,
        EventType.POLICY_EVALUATED,
        EventType.RECONCILIATION_STARTED,
        EventType.RECONCILIATION_RESOLVED,
        EventType.EFFECT_RESOLVED,
    }
)
"""The events of a call that stay queued when its start is refused (the rest were the start's)."""


def start(
    wiring: Wiring, attempt: Attempt, options: _Options, approval_id: str | None, charges: Sequence[Any] = (),
    ceiling: int | None = None,
) -> Steps[Any]:
    """Consume the approval, reserve the key and take the budget charges in one store
    transaction; record refusals."""
    action = attempt.action
    charging = {"charges": tuple(charges)} if charges else {}
    while True:
        def started(approval: Any, reservation: Any) -> list[Any]:
            # the start's events; the store may ask again if it has to plan the start anew
            events = list(attempt.pending)
            if approval is not None:
                attempt.spent(approval)
                events.append(attempt.new_event(EventType.APPROVAL_CONSUMED, approver=approval.approver,
                                                **consumed_data(attempt)))  # fmt: skip
            if reservation is not None:
                events.append(attempt.reserved(reservation))
            if reservation is None or not over_ceiling(reservation.attempt, ceiling):
                events.append(attempt.started())
            return events

        try:
            if approval_id is not None:  # the state approved, rechecked before it is spent
                yield from recheck(wiring, attempt, approval_id, options.preconditions)
            _, reservation, stored = yield call(
                wiring.store.start_attempt,
                action_id=action.action_id,
                effect_key=options.effect_key,
                lease=options.lease,
                approval_id=approval_id,
                action_hash=action.action_hash,
                events=started,
                return_events=bool(wiring.sinks),
                **charging,
            )
        except BudgetExhausted as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            raise (yield from refuse_budget(wiring, attempt, refusal)) from None
        except ApprovalMismatch as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_approval(wiring, attempt, refusal)
            raise
        except ActionDenied as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_denied_approval(wiring, attempt, refusal)
            raise
        except DuplicateEffect as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_reservation(wiring, attempt, refusal, state=refusal.state)
            raise
        except AmbiguousWrite as lost:
            raise (yield from lost_start(wiring, attempt, lost)) from None
        except AmbiguousEffect as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            if options.reconcile is not None and not attempt.reconciled:
                if (yield from reconcile(wiring.store, attempt, options, "blocking")) != "unknown":
                    continue  # resolved: reserve again (renewal, or a committed duplicate)
            yield from refuse_reservation(wiring, attempt, refusal, state=None)
            raise
        attempt.pending.clear()  # written by the start
        if charges:
            attempt.budget_charges = charged(charges)
        fan_out(wiring.sinks, stored, None)
        return reservation
