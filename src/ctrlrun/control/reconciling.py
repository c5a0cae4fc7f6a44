"""The reconcile hook: asked once per call what became of an ambiguous effect."""

from __future__ import annotations

import logging
from typing import cast

from .attempt import Attempt, describe, storable
from .options import _Options
from .steps import Steps, call
from ..effects.records import EffectState
from ..errors import CTRLRunError
from ..evidence.receipt import EventType
from ..store import StateStore

__all__ = ["reconcile"]

log = logging.getLogger("ctrlrun")


def reconcile(store: StateStore, attempt: Attempt, options: _Options, trigger: str) -> Steps[str]:
    """Ask the hook what became of an ambiguous effect; move the record if it knows."""
    key = options.effect_key
    if attempt.reconciled:  # asked once already in this call: its answer stands
        return "unknown"
    attempt.reconciled = True
    attempt.event(EventType.RECONCILIATION_STARTED, effect_key=key, trigger=trigger)
    try:
        assert options.reconcile is not None
        answer = yield call(options.reconcile, key)
    except Exception as exc:
        log.warning("reconcile hook for %r raised: %s", key, describe(exc))
        attempt.event(EventType.RECONCILIATION_RESOLVED, outcome="unknown", reason="raised",
                      error=describe(exc))  # fmt: skip
        return "unknown"
    if answer not in ("committed", "not_executed", "unknown"):
        log.warning("reconcile hook for %r returned %r; treating it as unknown", key, answer)
        attempt.event(EventType.RECONCILIATION_RESOLVED, outcome="unknown",
                      reason="invalid_return", error=storable(repr(answer)))  # fmt: skip
        return "unknown"
    attempt.event(EventType.RECONCILIATION_RESOLVED, outcome=answer)
    if answer == "unknown":
        return "unknown"
    state = EffectState.COMMITTED if answer == "committed" else EffectState.FAILED
    resolver = f"reconcile:{attempt.action.name}"
    try:
        yield call(store.resolve_effect, key, state, resolver)
    except CTRLRunError as exc:
        log.warning("reconcile of %r could not be recorded (%s); treating it as unknown", key, exc)
        return "unknown"
    attempt.event(EventType.EFFECT_RESOLVED, state=state.value, resolver=resolver,
                  resolved_by="reconcile")  # fmt: skip
    return cast(str, answer)
