"""``ctrlrun.effect``, the import path the docs name: effect records and states, idempotency tokens
(they live in ``ctrlrun.effects``)."""

from __future__ import annotations

from .effects.records import (  # noqa: F401
    DEFAULT_LEASE,
    LAPSED_LEASE_ERROR,
    EffectRecord,
    EffectState,
    Reservation,
    ReservationPlan,
    check_begin,
    check_commit,
    check_extend_lease,
    check_fail,
    check_line_text,
    check_mark_ambiguous,
    check_reservation_args,
    check_resolve,
    committed_duplicate,
    fresh_reservation,
    idempotency_token_for,
    lease_is_live,
    plan_reservation,
    storable_result,
    storable_text,
    stored_result,
)

__all__ = [
    "DEFAULT_LEASE",
    "EffectRecord",
    "EffectState",
    "LAPSED_LEASE_ERROR",
    "Reservation",
    "ReservationPlan",
    "check_begin",
    "check_commit",
    "check_extend_lease",
    "check_fail",
    "check_line_text",
    "check_mark_ambiguous",
    "check_reservation_args",
    "check_resolve",
    "committed_duplicate",
    "fresh_reservation",
    "idempotency_token_for",
    "lease_is_live",
    "plan_reservation",
    "storable_result",
    "storable_text",
    "stored_result",
]
