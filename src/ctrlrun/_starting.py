"""The start of a protected call: the presented approval spent, the key reserved and the budget
charged in one store transaction, and each refusal that start meets recorded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._attempt import Attempt, fan_out
from ._authorize import charged, refuse_budget
from ._ceiling import over_ceiling
from ._outcomes import lost_start
from ._preconditions import consumed_data, recheck
from ._refusals import refuse_approval, refuse_denied_approval, refuse_reservation
from ._settings import _Options
from ._steps import Steps, call
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    AmbiguousWrite,
    ApprovalMismatch,
    BudgetExhausted,
    DuplicateEffect,
)
from .receipt import EventType

if TYPE_CHECKING:
    from .control import Control

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
    control: Control, attempt: Attempt, options: _Options, approval_id: str | None, charges: Sequence[Any] = (),
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
                yield from recheck(control, attempt, approval_id, options.preconditions)
            _, reservation, stored = yield call(
                control._store.start_attempt,
                action_id=action.action_id,
                effect_key=options.effect_key,
                lease=options.lease,
                approval_id=approval_id,
                action_hash=action.action_hash,
                events=started,
                return_events=bool(control._sinks),
                **charging,
            )
        except BudgetExhausted as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            raise (yield from refuse_budget(control, attempt, refusal)) from None
        except ApprovalMismatch as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_approval(control, attempt, refusal)
            raise
        except ActionDenied as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_denied_approval(control, attempt, refusal)
            raise
        except DuplicateEffect as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            yield from refuse_reservation(control, attempt, refusal, state=refusal.state)
            raise
        except AmbiguousWrite as lost:
            raise (yield from lost_start(control, attempt, lost)) from None
        except AmbiguousEffect as refusal:
            attempt.pending = [e for e in attempt.pending if e.type in BEFORE_START]
            if options.reconcile is not None and not attempt.reconciled:
                if (yield from control._reconcile(attempt, options, "blocking")) != "unknown":
                    continue  # resolved: reserve again (renewal, or a committed duplicate)
            yield from refuse_reservation(control, attempt, refusal, state=None)
            raise
        attempt.pending.clear()  # written by the start
        if charges:
            attempt.budget_charges = charged(charges)
        fan_out(control._sinks, stored, None)
        return reservation
