"""The budget ledger and the delegation records in every store: their checks, their row codec
and the steps written once over the row interface (``Tx``).

A charge is checked and written inside the reservation's own transaction, after the reservation
table granted it; a charge is released (``released_at`` set, never deleted or decremented) in the
transaction that moves its effect record to ``failed``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ..authority.ledger import Charge, Consumption, DelegationRecord, first_exhausted, ledger_rows
from .._time import format_precise, parse_ts
from ..effects.records import EffectRecord, EffectState, Reservation
from ..errors import BudgetExhausted, InvalidArgument
from .rows import Tx

__all__ = [
    "DELEGATION_FIELDS",
    "LEDGER_FIELDS",
    "budget_lock_key",
    "charge",
    "check_charges",
    "check_delegation",
    "check_filter",
    "check_moment",
    "consumption_from_row",
    "delegation_from_row",
    "delegation_to_row",
    "release_on_failed",
]

_BIGINT = 2**63 - 1  # the ledger's amount column, and the largest limit a sum is compared with
_MAX_WINDOW = 100 * 366 * 86400  # seconds: a window of at most 100 years
DELEGATION_FIELDS = ("delegation_id", "parent_id", "depth", "grant_json", "created_by_agent",
                     "created_by_user", "created_via", "created_at", "revoked_at",
                     "revoked_by")  # fmt: skip
LEDGER_FIELDS = ("id", "grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at",
                 "released_at")  # fmt: skip


# --------------------------------------------------------------------------- checks


def _text(value: Any, what: str, *, empty: bool = False) -> str:
    """Text a store can keep (no NUL, no lone surrogate); non-empty unless ``empty``."""
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidArgument(f"{what} holds a NUL character, which no store keeps: {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{what} holds a lone surrogate and cannot be stored") from None
    return value


def _count(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{what} must be an int from {low} to {high}, got {value!r}")
    return value


def _aware(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value


def check_charges(charges: Any, effect_key: str | None) -> tuple[Charge, ...]:
    """The charges as a tuple, each checked so the ledger can keep it; charges need a key."""
    if isinstance(charges, (str, bytes)) or not isinstance(charges, Sequence):
        raise InvalidArgument(f"charges must be a sequence of Charge, got {charges!r}")
    checked = tuple(charges)
    for item in checked:
        if not isinstance(item, Charge):
            raise InvalidArgument(f"charges must hold Charge objects, got {item!r}")
        _text(item.grant_id, "a charge's grant_id")
        _text(item.metric, "a charge's metric")
        _count(item.amount, f"the amount charged to {item.grant_id}/{item.metric}", 0, _BIGINT)
        _count(item.limit, f"the limit of {item.grant_id}/{item.metric}", 0, _BIGINT)
        _count(item.window, f"the window of {item.grant_id}/{item.metric} (seconds)", 1,
               _MAX_WINDOW)  # fmt: skip
    if checked and effect_key is None:
        raise InvalidArgument(
            "charges need an effect key: a charge is held by the key's attempt and released "
            "when it fails; pass the call's effect key, or charge nothing"
        )
    return checked


def check_delegation(record: Any) -> DelegationRecord:
    """Refuse a record no store can keep as written (its meaning is judged when it is read)."""
    if not isinstance(record, DelegationRecord):
        raise InvalidArgument(f"expected a DelegationRecord, got {record!r}")
    name = record.delegation_id
    _text(name, "delegation_id")
    _text(record.parent_id, f"delegation {name}: parent_id")
    _count(record.depth, f"delegation {name}: depth", 0, 2**31 - 1)
    _text(record.grant_json, f"delegation {name}: grant_json")
    _text(record.created_by_agent, f"delegation {name}: created_by_agent")
    if record.created_by_user is not None:
        _text(record.created_by_user, f"delegation {name}: created_by_user")
    _text(record.created_via, f"delegation {name}: created_via")
    _aware(record.created_at, f"delegation {name}: created_at")
    if (record.revoked_at is None) != (record.revoked_by is None):
        raise InvalidArgument(
            f"delegation {name}: revoked_at and revoked_by are set together or not at all"
        )
    if record.revoked_at is not None:
        _aware(record.revoked_at, f"delegation {name}: revoked_at")
        _text(record.revoked_by, f"delegation {name}: revoked_by")
    return record


def check_filter(value: Any, what: str) -> str | None:
    """A lookup's optional text filter, checked as a stored value is."""
    return None if value is None else _text(value, what)


def check_moment(value: Any, what: str) -> datetime:
    """An aware datetime, or ``InvalidArgument`` naming ``what``."""
    return _aware(value, what)


# --------------------------------------------------------------------------- rows


def _ts(moment: datetime | None) -> str | None:
    return None if moment is None else format_precise(moment)


def delegation_to_row(record: DelegationRecord) -> dict[str, Any]:
    return {
        "delegation_id": record.delegation_id,
        "parent_id": record.parent_id,
        "depth": record.depth,
        "grant_json": record.grant_json,
        "created_by_agent": record.created_by_agent,
        "created_by_user": record.created_by_user,
        "created_via": record.created_via,
        "created_at": format_precise(record.created_at),
        "revoked_at": _ts(record.revoked_at),
        "revoked_by": record.revoked_by,
    }


def delegation_from_row(row: Mapping[str, Any]) -> DelegationRecord:
    """The record as stored; a row whose depth or times cannot be read refuses, naming it."""
    name = row.get("delegation_id")
    try:
        depth = row["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise ValueError(f"depth {depth!r} is not an integer")
        return DelegationRecord(
            delegation_id=row["delegation_id"],
            parent_id=row["parent_id"],
            depth=depth,
            grant_json=row["grant_json"],
            created_by_agent=row["created_by_agent"],
            created_by_user=row["created_by_user"],
            created_via=row["created_via"],
            created_at=parse_ts(row["created_at"]),
            revoked_at=None if row["revoked_at"] is None else parse_ts(row["revoked_at"]),
            revoked_by=row["revoked_by"],
        )
    except Exception as exc:
        raise InvalidArgument(
            f"the stored delegation {name!r} is unreadable ({exc}); the store was written by "
            "something other than ctrlrun: restore it from a backup, or revoke the delegation "
            "by hand"
        ) from None


def consumption_from_row(row: Mapping[str, Any]) -> Consumption:
    released = row["released_at"]
    return Consumption(
        id=int(row["id"]),
        grant_id=row["grant_id"],
        metric=row["metric"],
        amount=int(row["amount"]),
        effect_key=row["effect_key"],
        attempt=int(row["attempt"]),
        consumed_at=parse_ts(row["consumed_at"]),
        released_at=None if released is None else parse_ts(released),
    )


def budget_lock_key(scope: str, grant_id: str, metric: str) -> int:
    """A stable signed 64-bit key for one budget (of one store ``scope``), for a lock that
    serializes the writers charging it; a collision only serializes two budgets more."""
    digest = hashlib.sha256(f"{scope}\x00{grant_id}\x00{metric}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# --------------------------------------------------------------------------- the steps


def charge(
    tx: Tx, charges: Sequence[Charge], reservation: Reservation, now: datetime, action_id: str
) -> None:
    """Check every charge against what its budget spent in its window and write the ledger
    rows of this attempt; ``BudgetExhausted`` (the caller's transaction rolls back whole) for
    the first that does not fit. Called once the reservation is granted, in its transaction."""
    if not charges:
        return
    tx.lock_budgets(sorted({(c.grant_id, c.metric) for c in charges}))
    windows = sorted({(c.grant_id, c.metric, c.window) for c in charges})
    sums = dict(zip(windows, tx.spent([(g, m, now - timedelta(seconds=w)) for g, m, w in windows])))
    failing = first_exhausted(charges, lambda g, m, w: sums[(g, m, w)])
    if failing is not None:
        raise BudgetExhausted(
            grant_id=failing.grant_id, metric=failing.metric, window=failing.window,
            action_id=action_id,
        )  # fmt: skip
    tx.insert_consumptions(
        ledger_rows(charges), reservation.effect_key, reservation.attempt, now
    )


def release_on_failed(tx: Tx, record: EffectRecord) -> None:
    """Release the key's held charges when ``record`` (just written) is ``failed``; callers on
    the hot path test the state first, so a committed call makes no call here."""
    if record.state is EffectState.FAILED:
        tx.release_consumptions(record.effect_key, record.updated_at)
