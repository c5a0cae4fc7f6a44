"""Effects: the effect record, its states and the reservation table as pure rules (``records``),
idempotency tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .records import DEFAULT_LEASE, EffectRecord, EffectState, Reservation, idempotency_token_for

_LAZY: dict[str, str] = {
    "DEFAULT_LEASE": "records",
    "EffectRecord": "records",
    "EffectState": "records",
    "Reservation": "records",
    "idempotency_token_for": "records",
}

__all__ = ["DEFAULT_LEASE", "EffectRecord", "EffectState", "Reservation", "idempotency_token_for"]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
