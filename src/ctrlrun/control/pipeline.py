"""The pipeline of a protected call, top to bottom: normalize → decide → approve → reserve →
execute → resolve → record. Each step is a generator yielding the store work it needs done
(``steps``); the mode (enforce or observe) decides what a refusal does."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..action import Action
from ..effects.records import EffectState
from ..evidence.receipt import EventType, Receipt
from ..policy.decision import Decision, Evaluation
from . import ambient as _ambient
from .attempt import Attempt, storable
from .authorize import authorize, measure
from .ceiling import ceiling_of, refuse_early, refuse_reserved
from .modes import ENFORCE, OBSERVE
from .options import _Options
from .outcomes import finish, raised
from .steps import Steps, run_function, unwrap

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = ["execute", "refuse_effect_key", "run"]


def run(wiring: Wiring, action: Action, executor: Callable[[], Any], options: _Options,
        approval_id: str | None, evaluation: Evaluation | None = None) -> Steps[tuple[Any, Receipt]]:  # fmt: skip
    """One call through every step; returns the executor's value and the terminal receipt, or
    raises the refusal. ``evaluation`` is the policy's decision when the caller has it already
    (the straight path that gave way)."""
    mode = OBSERVE if wiring.observing else ENFORCE
    attempt = wiring.attempt(action, options.effect_key, approval_id, options.task, options.hop)
    attempt.observing = mode.observing

    # normalize
    attempt.event(EventType.ACTION_PROPOSED, action_hash=action.action_hash)

    # decide: the principal's expiry, the authority, then the policy (the stricter wins)
    expired = action.principal.expires_at
    if expired is not None and wiring.clock() > expired:
        yield from mode.expired_principal(wiring, attempt, expired)
    resolution = (yield from authorize(wiring, attempt)) if wiring.authority is not None else None
    if resolution is not None and not resolution.passed:  # observed: the policy is not asked
        evaluation = Evaluation(Decision.DENY, resolution.reason)
    else:
        if evaluation is None:
            evaluation = wiring.policy.evaluate(action)
        attempt.decision = str(evaluation.decision)
        attempt.reason = evaluation.reason
        attempt.controls = tuple(evaluation.controls)
        attempt.event(EventType.POLICY_EVALUATED, decision=attempt.decision, reason=attempt.reason)
    if evaluation.decision is Decision.DENY:
        yield from mode.denied(wiring, attempt, evaluation.reason)
    ceiling = ceiling_of(wiring, attempt)
    yield from refuse_early(wiring, attempt, ceiling)
    charges = yield from measure(wiring, attempt, resolution)

    # approve
    consume = evaluation.decision is Decision.APPROVE
    if consume:
        yield from mode.approve(wiring, attempt, options, approval_id)

    # reserve (the approval spent and the budgets charged in the same transaction)
    reservation = yield from mode.reserve(wiring, attempt, options, approval_id if consume else None,
                                          charges, ceiling)  # fmt: skip
    if reservation is not None and ceiling is not None and reservation.attempt > ceiling:
        yield from refuse_reserved(wiring, attempt, reservation, ceiling)  # raises unless observing
    if not consume and approval_id is not None:
        yield from mode.unneeded_approval(wiring, attempt, approval_id)

    # execute, resolve, record
    return (yield from execute(wiring, attempt, options, executor, reservation))


def execute(wiring: Wiring, attempt: Attempt, options: _Options, executor: Callable[[], Any],
            reservation: Any) -> Steps[tuple[Any, Receipt]]:  # fmt: skip
    """Run the function holding its key; record what it returned or raised."""
    key = options.effect_key if attempt.holding else None
    number = reservation.attempt if reservation is not None else 1
    with _ambient.holding_effect(key, number):
        try:
            value = yield run_function(executor)
        except BaseException as caught:
            exc = unwrap(caught)
            yield from raised(wiring, attempt, options, exc)
            if exc is caught:
                raise
            raise exc from None  # a GeneratorExit, carried in: the caller gets it back
    receipt = yield from finish(wiring, attempt, EffectState.COMMITTED, value, None, "returned")
    assert receipt is not None  # a refused outcome raised
    return value, receipt


def refuse_effect_key(wiring: Wiring, action: Action, error: Exception) -> Steps[None]:
    """Record an effect key that cannot be rendered (refused before policy: a denied receipt)."""
    attempt = wiring.attempt(action, None, _ambient.presented_approval(), None, None)
    attempt.reason = "effect_key_error"
    attempt.event(EventType.ACTION_PROPOSED, action_hash=action.action_hash)
    attempt.event(EventType.ACTION_DENIED, reason="effect_key_error")
    yield from wiring.record(attempt, attempt.receipt("denied", storable(str(error))))
