"""The authority step of a protected call: who may propose this action at all, and what it
charges; each refusal recorded with its events and a ``denied`` receipt."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .attempt import Attempt, storable
from ..authority.ledger import Charge, ledger_rows
from .observing import note, observe_unmeasurable
from .steps import Steps, call
from ..errors import ActionDenied, AuthorityDenied, BudgetExhausted, InvalidArgument
from ..evidence.receipt import EventType

if TYPE_CHECKING:
    from ..authority.resolve import Authority, Resolution  # noqa: F811
    from .wiring import Wiring

log = logging.getLogger("ctrlrun")

__all__ = ["authority_of", "authorize", "charged", "measure", "refuse_budget"]

_WHY = {
    "no_authority": "no grant or delegation covers this principal, action, resource and environment",
    "authority_constraint": "the grant that covers it does not allow these arguments",
    "authority_task": "the grant that covers it is limited to other tasks (or needs task=)",
    "authority_expired": "the grant that covers it has expired",
    "authority_revoked": "the delegation it rests on has been revoked",
    "authority_escalation": "the delegation it rests on is no longer inside its parent grant",
    "authority_unreadable": "a stored delegation cannot be read, so every action is refused",
}
_FIX = {
    "authority_unreadable": "inspect the store's delegations table (it was written by something "
    "else), revoke or repair the row",
}


def authority_of(policy_section: Mapping[str, Any] | None, override: Any) -> Authority | None:
    """The authority a Control enforces: ``override`` (an ``Authority`` or a section), else the
    policy's own section; ``None`` when neither declares one."""
    if override is None and policy_section is None:
        return None
    from ..authority.resolve import Authority

    if isinstance(override, Authority):
        return override
    section = override if override is not None else policy_section
    if not isinstance(section, Mapping):
        raise InvalidArgument(
            f"Control(authority=...) takes a ctrlrun.authority.Authority or an authority section "
            f"(a mapping with grants), not {type(section).__name__}"
        )
    return Authority.from_section(section)


def authorize(wiring: Wiring, attempt: Attempt) -> Steps[Resolution]:
    """Resolve the action's authority; a denial is recorded and raised as ``AuthorityDenied``."""
    from ..authority.resolve import Resolution, resolve

    authority = wiring.authority
    assert authority is not None
    action = attempt.action
    try:
        records = yield call(wiring.store.delegations, include_revoked=True)
    except InvalidArgument as unreadable:  # a row the store itself cannot read: fail closed
        log.warning("a stored delegation cannot be read (%s); every action is denied", unreadable)
        resolution = Resolution(False, "authority_unreadable")
    else:
        resolution = resolve(
            authority, records, action=action, environment=wiring.environment,
            task=attempt.task, now=wiring.clock(),
        )  # fmt: skip
    if resolution.passed:
        attempt.authority_grant_id = resolution.grant_id
        attempt.event(EventType.AUTHORITY_RESOLVED, **resolution.event_data())
        return resolution
    attempt.decision, attempt.reason = "deny", resolution.reason
    attempt.event(EventType.AUTHORITY_DENIED, **resolution.event_data())
    if attempt.observing:  # noted; the call goes on without asking the policy
        note(attempt, resolution.reason)
        return resolution
    attempt.event(EventType.ACTION_DENIED, reason=resolution.reason)
    yield from wiring.record(attempt, attempt.receipt("denied"))
    principal = action.principal
    who = f"agent {principal.agent!r}" + (f" (user {principal.user!r})" if principal.user else "")
    fix = _FIX.get(resolution.reason, "ask for a grant or a delegation that covers it")
    raise AuthorityDenied(
        f"action {action.name!r} denied by authority ({resolution.reason}): "
        f"{_WHY.get(resolution.reason, resolution.reason)} for {who}; {fix}",
        reason=resolution.reason,
        action_id=action.action_id,
        grant_id=resolution.grant_id,
        delegation_id=resolution.delegation_id,
    )


def measure(wiring: Wiring, attempt: Attempt, resolution: Resolution | None) -> Steps[tuple[Charge, ...]]:
    """The budget charges this call will take when it reserves; a call its grants cannot
    measure (no effect key, no usable metric) is recorded and raised as ``ActionDenied``."""
    if resolution is None:
        return ()
    from ..authority.resolve import charges_for

    if not resolution.passed:
        return ()
    try:
        charges = charges_for(resolution, attempt.action.arguments, attempt.effect_key)
    except ActionDenied as refusal:
        refusal.action_id = attempt.action.action_id
        if attempt.observing:
            observe_unmeasurable(attempt, refusal)
            return ()
        error = storable(str(refusal))
        attempt.decision, attempt.reason = "deny", refusal.reason
        attempt.event(EventType.ACTION_DENIED, reason=refusal.reason, error=error)
        yield from wiring.record(attempt, attempt.receipt("denied", error))
        raise
    if attempt.observing:  # what would have been charged, though nothing is
        attempt.budget_charges = charged(charges)
    return charges


def charged(charges: Sequence[Charge]) -> tuple[Mapping[str, Any], ...]:
    """The receipt's ``budget_charges``: one entry per ledger row the charges wrote."""
    return tuple(
        {"grant_id": grant_id, "metric": metric, "amount": amount}
        for grant_id, metric, amount in ledger_rows(charges)
    )


def refuse_budget(wiring: Wiring, attempt: Attempt, refusal: BudgetExhausted) -> Steps[BudgetExhausted]:
    """A reservation refused for a budget: nothing reserved or charged; a ``denied`` receipt.
    Answers the refusal to raise, naming this action."""
    named = BudgetExhausted(
        grant_id=refusal.grant_id, metric=refusal.metric, window=refusal.window,
        action_id=attempt.action.action_id,
    )  # fmt: skip
    attempt.decision, attempt.reason = "deny", "budget_exhausted"
    attempt.budget_charges = ()
    attempt.approver = attempt.edited_from = attempt.edit_diff = None  # the approval was not spent
    attempt.event(
        EventType.ACTION_DENIED, reason="budget_exhausted", grant_id=refusal.grant_id,
        metric=refusal.metric, window=refusal.window,
    )  # fmt: skip
    yield from wiring.record(attempt, attempt.receipt("denied", storable(str(named))))
    return named
