"""What a protected call's function leaves behind: its outcome written with its event and receipt,
and what the call says and does when a store write around the function fails.

Before the function runs, a start whose COMMIT went unanswered is read back: a reservation that
landed is released (the function provably never ran), so the key never lapses into
``ambiguous`` for nothing. After the function ran, the error never claims that nothing ran: it
names the key, says the function ran, and gives the next step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from ..effects.records import EffectState
from ..errors import AmbiguousEffect, AmbiguousWrite, CTRLRunError, DuplicateEffect, InvalidArgument, NotExecuted
from ..evidence.receipt import EventType, Receipt
from .attempt import Attempt, describe, fan_out, message_of, storable
from .options import _Options
from .reconciling import reconcile
from .steps import Steps, call

if TYPE_CHECKING:
    from .wiring import Wiring

__all__ = ["finish", "lost_start", "outcome_unrecorded", "raised", "unrecorded"]

log = logging.getLogger("ctrlrun")

_NOT_RUN = "start not confirmed; the function was not run"


def lost_start(wiring: Wiring, attempt: Attempt, error: AmbiguousWrite) -> Steps[AmbiguousWrite]:
    """Settle a start whose COMMIT went unanswered; the error for the caller to raise."""
    key, name = attempt.effect_key, attempt.action.name
    if key is None:
        return AmbiguousWrite(
            f"action {name!r}: {_NOT_RUN} ({error}); it has no effect key, so a retry runs "
            "it (nothing else was decided)"
        )
    try:
        record = yield call(wiring.store.get_effect, key)
    except CTRLRunError as unreadable:
        return AmbiguousWrite(
            f"effect {key!r}: {_NOT_RUN} ({error}), and the store could not be read back "
            f"({unreadable}). If the start was kept, the key is held until its lease lapses and "
            f"then shows ambiguous: the function never ran, so `ctrlrun resolve {key} --failed` "
            "then lets a retry run it once"
        )
    if (
        record is None
        or record.action_id != attempt.action.action_id
        or record.state is not EffectState.EXECUTING
    ):
        return AmbiguousWrite(
            f"effect {key!r}: {_NOT_RUN} ({error}); the store kept nothing of this attempt, "
            "so a retry is safe"
        )
    attempt.pending.clear()  # its events were kept with the reservation
    attempt.attempt = record.attempt
    try:
        yield from finish(
            wiring, attempt, EffectState.FAILED, None, storable(_NOT_RUN), "was not run", ran=False
        )
    except CTRLRunError as unwritable:
        return AmbiguousWrite(
            f"effect {key!r}: {_NOT_RUN} ({error}); the store kept the reservation and could not "
            f"release it ({unwritable}). The key shows ambiguous once its lease lapses: the "
            f"function never ran, so `ctrlrun resolve {key} --failed` then lets a retry run it"
        )
    return AmbiguousWrite(
        f"effect {key!r}: {_NOT_RUN} ({error}); the store had kept the reservation, which is "
        "now released (failed, with its receipt), so a retry runs the function once"
    )


def outcome_unrecorded(attempt: Attempt, did: str, error: CTRLRunError) -> AmbiguousWrite:
    """The error of a function that ran (``did``: "returned", "raised X") whose outcome the
    store did not take."""
    key, action = attempt.effect_key, attempt.action
    cause = str(error).split("; ")[0]  # what failed, without advice meant for an unrun write
    if key is None:
        message = (
            f"action {action.name!r} ({action.action_id}) ran and {did}, but its receipt could "
            f"not be written to the store ({cause}); the call has no effect key, so nothing "
            "blocks a retry: find out whether it took effect before running it again"
        )
    else:
        message = (
            f"effect {key!r}: the function ran and {did}, but the store did not take its outcome "
            f"({cause}). The key stays executing under {action.action_id} and shows ambiguous "
            f"once its lease lapses; find out whether the effect happened, then run "
            f"`ctrlrun resolve {key} --committed` or `--failed`. Do not retry blindly"
        )
    log.error("%s", message)
    return AmbiguousWrite(message, effect_key=key, action_id=action.action_id)


_EVENT_OF = {
    EffectState.COMMITTED: EventType.EXECUTION_COMMITTED,
    EffectState.FAILED: EventType.EXECUTION_FAILED,
    EffectState.AMBIGUOUS: EventType.EXECUTION_AMBIGUOUS,
}


def finish(wiring: Wiring, attempt: Attempt, outcome: EffectState, value: Any, error: str | None,
           did: str, *, ran: bool = True) -> Steps[Receipt | None]:  # fmt: skip
    """Write the outcome, its event and the receipt in one transaction (the store retries
    it); one it never confirms raises ``AmbiguousWrite`` saying that the function ``ran``."""
    attempt.event(_EVENT_OF[outcome], **({} if error is None else {"error": error}))
    receipt = attempt.receipt(outcome.value, error)
    if not attempt.holding:  # observed, its reservation refused: no record to move
        return (yield from wiring.record(attempt, receipt))
    try:
        events, stored = yield call(
            wiring.store.finish_attempt,
            effect_key=attempt.effect_key,
            action_id=attempt.action.action_id,
            outcome=outcome if attempt.effect_key else None,
            result=value,
            error=error,
            events=attempt.take(),
            receipt=receipt,
            return_events=bool(wiring.sinks),
        )
    except (AmbiguousEffect, DuplicateEffect, InvalidArgument) as refusal:
        if not attempt.effect_key:
            raise
        attempt.pending.clear()
        yield from unrecorded(wiring, attempt, did, refusal)
        raise refusal from None
    except CTRLRunError as failed:
        if not ran:
            raise
        raise outcome_unrecorded(attempt, did, failed) from None
    fan_out(wiring.sinks, events, stored)
    return cast("Receipt | None", stored)


def unrecorded(wiring: Wiring, attempt: Attempt, did: str, refusal: CTRLRunError) -> Steps[None]:
    """The store refused the outcome of a function that ran: record it ambiguous."""
    message = storable(f"the function {did}, but its outcome could not be recorded: {refusal}")
    attempt.event(EventType.EXECUTION_AMBIGUOUS, error=message)
    yield from wiring.record(attempt, attempt.receipt("ambiguous", message))


def raised(wiring: Wiring, attempt: Attempt, options: _Options, exc: BaseException) -> Steps[None]:
    """Record what a function that raised leaves behind; the caller re-raises ``exc``."""
    # The function's own exception always goes on; what became of its outcome in the store
    # (not written, or refused because the key was resolved meanwhile) rides on it as a note.
    if isinstance(exc, NotExecuted):
        error = storable(message_of(exc) or describe(exc))
        try:
            failed = yield from finish(wiring, attempt, EffectState.FAILED, None, error, "raised NotExecuted")
        except (AmbiguousWrite, AmbiguousEffect, DuplicateEffect, InvalidArgument) as unwritten:
            exc.add_note(_outcome_note(attempt, unwritten))
            return
        _hand_receipt(exc, failed)
        return
    try:
        wrote = yield from finish(
            wiring, attempt, EffectState.AMBIGUOUS, None, describe(exc), "raised " + type(exc).__name__,
        )  # fmt: skip
    except (AmbiguousWrite, AmbiguousEffect, DuplicateEffect, InvalidArgument) as unwritten:
        exc.add_note(_outcome_note(attempt, unwritten))
        return
    _hand_receipt(exc, wrote)
    if (wrote and options.reconcile_eagerly and isinstance(exc, Exception) and options.effect_key
            and not attempt.observing):  # fmt: skip
        yield from reconcile(wiring.store, attempt, options, "eager")
        if attempt.pending:
            yield from wiring.record(attempt, None)


def _outcome_note(attempt: Attempt, unwritten: CTRLRunError) -> str:
    """The note a function's exception carries when the store did not take its outcome."""
    if isinstance(unwritten, AmbiguousWrite):
        return str(unwritten)
    key = attempt.effect_key
    return (f"ctrlrun: effect {key!r} was settled by someone else while the function ran, so this "
            f"attempt's outcome was recorded as ambiguous beside it, not on the key: {unwritten}")


def _hand_receipt(exc: BaseException, receipt: Receipt | None) -> None:
    """An executor's exception that declares ``receipt = None`` gets the receipt recorded for it
    (the MCP gateway names it in its answer)."""
    if receipt is not None and getattr(exc, "receipt", 0) is None:
        setattr(exc, "receipt", receipt)
