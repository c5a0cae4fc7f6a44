"""What a protected call says and does when a store write around the function fails.

Before the function runs, a start whose COMMIT went unanswered is read back: a reservation that
landed is released (the function provably never ran), so the key never lapses into
``ambiguous`` for nothing. After the function ran, the error never claims that nothing ran: it
names the key, says the function ran, and gives the next step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._attempt import Attempt, storable
from ._steps import Steps, call
from .effect import EffectState
from .errors import AmbiguousWrite, CTRLRunError

if TYPE_CHECKING:
    from .control import Control

__all__ = ["lost_start", "outcome_unrecorded"]

log = logging.getLogger("ctrlrun")

_NOT_RUN = "start not confirmed; the function was not run"


def lost_start(control: Control, attempt: Attempt, error: AmbiguousWrite) -> Steps[AmbiguousWrite]:
    """Settle a start whose COMMIT went unanswered; the error for the caller to raise."""
    key, name = attempt.effect_key, attempt.action.name
    if key is None:
        return AmbiguousWrite(
            f"action {name!r}: {_NOT_RUN} ({error}); it has no effect key, so a retry runs "
            "it (nothing else was decided)"
        )
    try:
        record = yield call(control.store.get_effect, key)
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
        yield from control._finish(
            attempt, EffectState.FAILED, None, storable(_NOT_RUN), "was not run", ran=False
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
