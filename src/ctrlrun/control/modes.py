"""The two modes a policy runs in, as the pipeline's steps meet them: enforce records each refusal
and raises it, asks a human and spends the approval; observe records the same events, notes the
first refusal as the receipt's ``blocked_reason`` and lets the call go on."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._time import format_ts
from ..errors import ActionDenied, ApprovalRequired, CTRLRunError
from ..evidence.receipt import EventType
from ..policy.decision import Decision
from .attempt import Attempt
from .observing import note, observe_approval, observe_asking, observe_budgets, observe_start
from .options import _Options
from .preconditions import request_fingerprint
from .refusals import refuse_before_asking
from .starting import start
from .steps import Steps, call

if TYPE_CHECKING:
    from ..policy import Policy
    from .wiring import Wiring

__all__ = ["ENFORCE", "OBSERVE", "Enforce", "Observe", "denial_message"]

log = logging.getLogger("ctrlrun")


class Enforce:
    """Enforce mode: a refusal is recorded and raised; approvals are asked for and spent."""

    observing = False

    def expired_principal(self, wiring: Wiring, attempt: Attempt, expired: datetime) -> Steps[None]:
        """Refuse a principal whose credential expired."""
        action = attempt.action
        attempt.decision, attempt.reason = str(Decision.DENY), "principal_expired"
        attempt.event(EventType.ACTION_DENIED, reason="principal_expired")
        yield from wiring.record(attempt, attempt.receipt("denied"))
        raise ActionDenied(
            f"action {action.name!r} denied: the principal {action.principal.agent!r} "
            f"expired at {format_ts(expired)}; renew its credential before calling again",
            reason="principal_expired",
            action_id=action.action_id,
        )

    def denied(self, wiring: Wiring, attempt: Attempt, reason: str) -> Steps[None]:
        """Refuse what the policy (or the authority) denied."""
        action = attempt.action
        attempt.event(EventType.ACTION_DENIED, reason=reason)
        yield from wiring.record(attempt, attempt.receipt("denied"))
        raise ActionDenied(denial_message(wiring.policy, action.name, reason), reason=reason,
                           action_id=action.action_id)  # fmt: skip

    def approve(self, wiring: Wiring, attempt: Attempt, options: _Options, approval_id: str | None) -> Steps[None]:
        """An action that needs approval: without one presented, refuse what the key already
        refuses, then ask (``ApprovalRequired``); a presented one is spent by the start."""
        if approval_id is not None:
            return
        yield from refuse_before_asking(wiring, attempt, options.lease)
        action = attempt.action
        fingerprinted = yield from request_fingerprint(wiring, attempt, options.preconditions)
        request = yield call(wiring.approvals.request, action, wiring.approval_ttl,
                             policy_hash=wiring.policy_hash, **fingerprinted)  # fmt: skip
        attempt.event(
            EventType.APPROVAL_REQUESTED,
            approval_id=request.request_id,
            action_hash=action.action_hash,
            expires_at=format_ts(request.expires_at),
        )
        yield from wiring.record(attempt, None)
        raise ApprovalRequired(request_id=request.request_id, action_id=action.action_id,
                               action_hash=action.action_hash)  # fmt: skip

    def reserve(self, wiring: Wiring, attempt: Attempt, options: _Options, approval_id: str | None,
                charges: Sequence[Any], ceiling: int | None) -> Steps[Any]:  # fmt: skip
        """Spend the approval, reserve the key and charge the budgets in one transaction."""
        return (yield from start(wiring, attempt, options, approval_id, charges, ceiling))

    def unneeded_approval(self, wiring: Wiring, attempt: Attempt, approval_id: str) -> Steps[None]:
        """An allowed action presenting a matching grant closes it; any failure is ignored."""
        try:
            approval = yield call(wiring.store.consume_approval, approval_id, attempt.action.action_hash)
            attempt.spent(approval)
        except CTRLRunError as exc:
            log.info("presented approval %s left as it was: %s", approval_id, exc)


class Observe(Enforce):
    """Observe mode: every refusal enforce would make is recorded and noted, never raised; nobody
    is asked, nothing is spent or charged."""

    observing = True

    def expired_principal(self, wiring: Wiring, attempt: Attempt, expired: datetime) -> Steps[None]:
        note(attempt, "principal_expired")
        return
        yield  # a step like the others

    def denied(self, wiring: Wiring, attempt: Attempt, reason: str) -> Steps[None]:
        note(attempt, reason)
        return
        yield

    def approve(self, wiring: Wiring, attempt: Attempt, options: _Options, approval_id: str | None) -> Steps[None]:
        if approval_id is None:
            yield from observe_asking(wiring, attempt, options)
        else:
            yield from observe_approval(wiring, attempt, approval_id, options)

    def reserve(self, wiring: Wiring, attempt: Attempt, options: _Options, approval_id: str | None,
                charges: Sequence[Any], ceiling: int | None) -> Steps[Any]:  # fmt: skip
        reservation = yield from observe_start(wiring, attempt, options)
        yield from observe_budgets(wiring, attempt, charges)
        return reservation

    def unneeded_approval(self, wiring: Wiring, attempt: Attempt, approval_id: str) -> Steps[None]:
        return
        yield


ENFORCE = Enforce()
OBSERVE = Observe()


def denial_message(policy: Policy, name: str, reason: str) -> str:
    """What a policy denial says; an action the policy does not name says which file was read
    and the nearest name it does have (a typo in the decorator or in the policy)."""
    if reason != "unknown_action":
        return f"action {name!r} denied by policy ({reason})"
    import difflib

    known = policy.actions
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0]!r}?)." if nearest else (
        f"; it names {', '.join(repr(a) for a in known[:5])}{', …' if len(known) > 5 else ''}."
        if known else "; it names no action.")  # fmt: skip
    return (f"action {name!r} denied by policy (unknown_action): {policy.source} has no entry "
            f"for it under actions{hint} Fix the name, or add the action to the policy")  # fmt: skip
