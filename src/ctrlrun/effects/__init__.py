"""Effects: the effect record, its states and the reservation table (pure rules), idempotency tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .records import DEFAULT_LEASE, LAPSED_LEASE_ERROR, EffectRecord, EffectState, Reservation, ReservationPlan, check_begin, check_commit, check_extend_lease, check_fail, check_line_text, check_mark_ambiguous, check_reservation_args, check_resolve, committed_duplicate, fresh_reservation, idempotency_token_for, lease_is_live, plan_reservation, storable_result, storable_text, stored_result

_LAZY: dict[str, str] = {
    "DEFAULT_LEASE": "records",
    "LAPSED_LEASE_ERROR": "records",
    "EffectRecord": "records",
    "EffectState": "records",
    "Reservation": "records",
    "ReservationPlan": "records",
    "check_begin": "records",
    "check_commit": "records",
    "check_extend_lease": "records",
    "check_fail": "records",
    "check_line_text": "records",
    "check_mark_ambiguous": "records",
    "check_reservation_args": "records",
    "check_resolve": "records",
    "committed_duplicate": "records",
    "fresh_reservation": "records",
    "idempotency_token_for": "records",
    "lease_is_live": "records",
    "plan_reservation": "records",
    "storable_result": "records",
    "storable_text": "records",
    "stored_result": "records",
}

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

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
