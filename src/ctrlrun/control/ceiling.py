"""The attempt ceiling (``max_attempts``): how many attempts may execute on one effect key.

The guarantee is the check on the attempt number the store assigned, after the reservation and
before the function runs; the fast path before asking a human only spares an approval for an
attempt that would be refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .attempt import Attempt
from .observing import note
from .steps import Steps, call
from ..effects.records import EffectState
from ..errors import ActionDenied
from ..evidence.receipt import EventType

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = ["ceiling_of", "over_ceiling", "refuse_early", "refuse_reserved"]

log = logging.getLogger("ctrlrun")


def ceiling_of(wiring: Wiring, attempt: Attempt) -> int | None:
    """The action's ``max_attempts``, or ``None`` (none declared, or no key to count on)."""
    ceiling = wiring.policy.max_attempts(attempt.action.name)
    if ceiling is None:
        return None
    if attempt.effect_key is None:
        warned = wiring.ceiling_warned
        if attempt.action.name not in warned:
            warned.add(attempt.action.name)
            log.warning(
                "action %r has max_attempts: %d but this call has no effect key: nothing to "
                "count attempts on, so no ceiling applies", attempt.action.name, ceiling,
            )  # fmt: skip
        return None
    return ceiling


def over_ceiling(number: int, ceiling: int | None) -> bool:
    return ceiling is not None and number > ceiling


def _refused(attempt: Attempt, number: int, ceiling: int) -> ActionDenied:
    attempt.event(EventType.EFFECT_RESERVATION_REFUSED, reason="attempt_ceiling", attempt=number,
                  max_attempts=ceiling)  # fmt: skip
    attempt.attempt = number
    return ActionDenied(
        f"action {attempt.action.name!r} refused: effect {attempt.effect_key} would run attempt "
        f"{number} but max_attempts is {ceiling} (attempt_ceiling); find out why the earlier "
        "attempts failed, or raise max_attempts in the policy",
        reason="attempt_ceiling",
        action_id=attempt.action.action_id,
    )


def refuse_early(wiring: Wiring, attempt: Attempt, ceiling: int | None) -> Steps[None]:
    """Before asking anyone: a ``failed`` record whose next attempt would pass the ceiling is
    refused with nothing reserved, nothing consumed and no approval request."""
    if ceiling is None:
        return
    record = yield call(wiring.store.get_effect, attempt.effect_key)
    if record is None or record.state is not EffectState.FAILED or record.attempt + 1 <= ceiling:
        return
    refusal = _refused(attempt, record.attempt + 1, ceiling)
    if attempt.observing:  # noted; the reservation is still attempted
        attempt.attempt = 1
        note(attempt, "attempt_ceiling")
        return
    yield from wiring.record(attempt, attempt.receipt("blocked", str(refusal)))
    raise refusal


def refuse_reserved(wiring: Wiring, attempt: Attempt, reservation: Any, ceiling: int) -> Steps[None]:
    """The store assigned an attempt over the ceiling: record the refusal, then release the
    record as ``failed`` (its budget charge with it) without running the function."""
    number = reservation.attempt
    refusal = _refused(attempt, number, ceiling)
    if attempt.observing:  # noted; the attempt owns the record and runs
        note(attempt, "attempt_ceiling")
        return
    yield from wiring.record(attempt, attempt.receipt("blocked", str(refusal)))
    yield call(
        wiring.store.fail_effect, attempt.effect_key, attempt.action.action_id,
        f"attempt {number} refused: max_attempts is {ceiling}",
    )  # fmt: skip
    raise refusal
