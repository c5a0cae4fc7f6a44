"""Effect records and the pure rules that move them; every store calls these, none copies them."""

from __future__ import annotations

import hashlib
import json
import unicodedata
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from .._frozen import builder
from ..action import canonical_bytes
from ..errors import AmbiguousEffect, CTRLRunError, DuplicateEffect, InvalidArgument

__all__ = [
    "DEFAULT_LEASE",
    "LAPSED_LEASE_ERROR",
    "EffectRecord",
    "EffectState",
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

DEFAULT_LEASE = timedelta(minutes=5)
LAPSED_LEASE_ERROR = "lease expired: the worker holding this effect never finished"
IDEMPOTENCY_SCHEMA = "ctrlrun.idempotency/v1"
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


class EffectState(StrEnum):
    """Where an effect key stands; ``new`` means no record and is never stored."""

    NEW = "new"
    RESERVED = "reserved"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


_LEASED = frozenset({EffectState.RESERVED, EffectState.EXECUTING})
_EXECUTING = frozenset({EffectState.EXECUTING})


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """The stored state of one effect key."""

    effect_key: str
    state: EffectState
    action_id: str
    attempt: int
    created_at: datetime
    updated_at: datetime
    lease_expires_at: datetime | None = None
    result: Any = None
    error: str | None = None
    resolved_by: str | None = None
    #: the action whose attempt holds or settled the key (``None`` on records made before it was kept)
    action_hash: str | None = None
    #: the stored result equals the returned value type for type (not a ``repr``, not set by hand)
    result_exact: bool = False

    def __post_init__(self) -> None:
        if type(self.state) is not EffectState:
            object.__setattr__(self, "state", EffectState(self.state))


@dataclass(frozen=True, slots=True)
class Reservation:
    """The right to run an effect once: the attempt that holds the key, until its lease lapses."""

    effect_key: str
    action_id: str
    attempt: int
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True)
class ReservationPlan:
    """What a reservation must do: ``insert``, ``renew``, ``refuse`` or ``keep_then_refuse``.

    ``write`` is the record to write (``expected`` is the record it replaces, for compare-and-set);
    ``error`` is raised for ``refuse`` and, after committing ``write``, for ``keep_then_refuse``.
    """

    kind: str
    write: EffectRecord | None = None
    expected: EffectRecord | None = None
    error: CTRLRunError | None = None

    @property
    def reservation(self) -> Reservation:
        record = self.write
        if self.kind not in ("insert", "renew") or record is None:
            raise InvalidArgument(f"a {self.kind!r} plan grants no reservation")
        assert record.lease_expires_at is not None
        return Reservation(
            record.effect_key, record.action_id, record.attempt, record.lease_expires_at
        )


def lease_is_live(record: EffectRecord | None, now: datetime) -> bool:
    """True iff the record holds a lease (reserved/executing) that has not lapsed at ``now``."""
    return (
        record is not None
        and record.state in _LEASED
        and record.lease_expires_at is not None
        and now <= record.lease_expires_at
    )


_ZERO = timedelta(0)


def _require_id(value: Any, what: str) -> str:
    if type(value) is str and value.isascii() and value:
        return value  # ASCII text: nothing to refuse
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} holds a lone surrogate; pass valid Unicode text") from None
    return value


def check_reservation_args(effect_key: Any, action_id: Any, lease: Any) -> None:
    """Refuse an empty key or action id, or a lease that is not a positive ``timedelta``."""
    _require_id(effect_key, "effect_key")
    _require_id(action_id, "action_id")
    if type(lease) is not timedelta and not isinstance(lease, timedelta) or lease <= _ZERO:
        raise InvalidArgument(f"lease must be a positive timedelta, got {lease!r}")


new_record = builder(EffectRecord)  # EffectRecord(...) at a third of the cost: ``state`` an EffectState
new_reservation = builder(Reservation)  # Reservation(...) likewise


def fresh_reservation(
    effect_key: str, action_id: str, until: datetime, now: datetime, state: EffectState,
    action_hash: str | None = None,
) -> tuple[EffectRecord, Reservation]:
    """The record a key without one gets (attempt 1, leased ``until``), and its reservation;
    the arguments are checked by the caller (``check_reservation_args``)."""
    return (
        new_record(effect_key, state, action_id, 1, now, now, until, None, None, None, action_hash),
        new_reservation(effect_key, action_id, 1, until),
    )


def plan_reservation(
    record: EffectRecord | None,
    effect_key: str,
    action_id: str,
    lease: timedelta,
    now: datetime,
    *,
    state: EffectState = EffectState.RESERVED,
    action_hash: str | None = None,
) -> ReservationPlan:
    """The reservation table as one function; ``state=EXECUTING`` reserves and begins at once.

    ``action_hash`` is the reserving action's: it is kept on the record, and a committed key
    settled by the same action with an exact result refuses with a replayable duplicate."""
    check_reservation_args(effect_key, action_id, lease)
    if state not in _LEASED:
        raise InvalidArgument(f"a reservation is written reserved or executing, not {state}")
    until = now + lease
    if record is None:
        return ReservationPlan(
            "insert", write=fresh_reservation(effect_key, action_id, until, now, state, action_hash)[0]
        )
    if record.state is EffectState.COMMITTED:
        return ReservationPlan("refuse", error=committed_duplicate(record, action_hash))
    if record.state is EffectState.AMBIGUOUS:
        return ReservationPlan(
            "refuse", error=AmbiguousEffect(effect_key=effect_key, action_id=record.action_id)
        )
    if lease_is_live(record, now):
        return ReservationPlan(
            "refuse", error=DuplicateEffect(state="in_progress", effect_key=effect_key)
        )
    if record.state is EffectState.EXECUTING:
        lapsed = replace(
            record,
            state=EffectState.AMBIGUOUS,
            updated_at=now,
            lease_expires_at=None,
            error=LAPSED_LEASE_ERROR,
        )
        return ReservationPlan(
            "keep_then_refuse",
            write=lapsed,
            expected=record,
            error=AmbiguousEffect(effect_key=effect_key, action_id=record.action_id),
        )
    # failed, or reserved with a lapsed lease: the function never ran under it, so renew.
    renewed = EffectRecord(
        effect_key, state, action_id, record.attempt + 1, record.created_at, now, until,
        None, None, None, action_hash,
    )  # fmt: skip
    return ReservationPlan("renew", write=renewed, expected=record)


def committed_duplicate(record: EffectRecord, action_hash: str | None) -> DuplicateEffect:
    """The refusal of a committed key: replayable (its stored result handed back) only when the
    refused call is the action that committed it and the result was stored exactly."""
    replayable = (
        action_hash is not None and record.action_hash == action_hash and record.result_exact
    )
    return DuplicateEffect(
        state="committed", effect_key=record.effect_key, replayable=replayable,
        result=record.result if replayable else None,
    )  # fmt: skip


def _refuse_transition(
    record: EffectRecord | None, effect_key: str, action_id: str, now: datetime, doing: str
) -> CTRLRunError:
    if record is None:
        return InvalidArgument(f"cannot {doing} effect {effect_key!r}: no such effect record")
    if record.state is EffectState.AMBIGUOUS:
        return AmbiguousEffect(effect_key=effect_key, action_id=record.action_id)
    if record.state is EffectState.COMMITTED:
        return DuplicateEffect(state="committed", effect_key=effect_key)
    if record.action_id != action_id and lease_is_live(record, now):
        return DuplicateEffect(state="in_progress", effect_key=effect_key)
    return InvalidArgument(
        f"cannot {doing} effect {effect_key!r}: it is {record.state} under "
        f"{record.action_id} (attempt {record.attempt}), not held by {action_id}"
    )


def _holder(
    record: EffectRecord | None,
    effect_key: str,
    action_id: str,
    now: datetime,
    accepted: frozenset[EffectState],
    doing: str,
) -> EffectRecord:
    _require_id(effect_key, "effect_key")
    _require_id(action_id, "action_id")
    if record is not None and record.action_id == action_id and record.state in accepted:
        return record
    raise _refuse_transition(record, effect_key, action_id, now, doing)


def check_begin(
    record: EffectRecord | None, effect_key: str, action_id: str, now: datetime
) -> EffectRecord:
    """``reserved`` under ``action_id`` → ``executing`` (the lease is kept)."""
    held = _holder(record, effect_key, action_id, now, frozenset({EffectState.RESERVED}), "begin")
    return replace(held, state=EffectState.EXECUTING, updated_at=now)


def check_commit(
    record: EffectRecord | None, effect_key: str, action_id: str, result: Any, now: datetime
) -> EffectRecord:
    """``executing`` under ``action_id`` → ``committed`` with the (storable) result."""
    held = _holder(record, effect_key, action_id, now, _EXECUTING, "commit")
    # replace(held, state=COMMITTED, updated_at=now, lease_expires_at=None, result=...) spelled
    # out: it runs on every allowed call
    stored, exact = stored_result(result)
    return new_record(
        held.effect_key, EffectState.COMMITTED, held.action_id, held.attempt, held.created_at,
        now, None, stored, held.error, held.resolved_by, held.action_hash, exact,
    )  # fmt: skip


def check_fail(
    record: EffectRecord | None, effect_key: str, action_id: str, error: Any, now: datetime
) -> EffectRecord:
    """``executing`` under ``action_id`` → ``failed`` with the (storable) error text."""
    held = _holder(record, effect_key, action_id, now, frozenset({EffectState.EXECUTING}), "fail")
    return replace(
        held,
        state=EffectState.FAILED,
        updated_at=now,
        lease_expires_at=None,
        error=_error_text(error),
    )


def check_mark_ambiguous(
    record: EffectRecord | None, effect_key: str, action_id: str, error: Any, now: datetime
) -> EffectRecord:
    """``reserved``/``executing``/``ambiguous`` of ``action_id`` → ``ambiguous`` with the error."""
    accepted = frozenset({EffectState.RESERVED, EffectState.EXECUTING, EffectState.AMBIGUOUS})
    held = _holder(record, effect_key, action_id, now, accepted, "mark ambiguous")
    return replace(
        held,
        state=EffectState.AMBIGUOUS,
        updated_at=now,
        lease_expires_at=None,
        error=_error_text(error),
    )


def check_resolve(
    record: EffectRecord | None, effect_key: str, state: Any, resolver: str, now: datetime
) -> EffectRecord:
    """Only ``ambiguous`` → ``committed``/``failed``, naming the resolver; anything else refused."""
    _require_id(effect_key, "effect_key")
    check_line_text(resolver, "resolver")
    try:
        target = EffectState(state)
    except ValueError:
        target = None
    if target not in (EffectState.COMMITTED, EffectState.FAILED):
        raise InvalidArgument(f"an effect resolves to committed or failed, not {state!r}")
    if record is None:
        raise InvalidArgument(f"cannot resolve effect {effect_key!r}: no such effect record")
    if record.state is not EffectState.AMBIGUOUS:
        raise InvalidArgument(
            f"cannot resolve effect {effect_key!r}: it is {record.state}, "
            "and only an ambiguous effect is resolved"
        )
    error = f"resolved {target} by {resolver}"
    if record.error:
        error += f" (was: {record.error})"
    return replace(
        record,
        state=target,
        updated_at=now,
        lease_expires_at=None,
        error=error,
        resolved_by=resolver,
        result_exact=False,
    )


def check_extend_lease(
    record: EffectRecord | None, effect_key: str, action_id: str, until: Any, now: datetime
) -> EffectRecord:
    """Move a live ``executing`` lease of ``action_id`` later; never revive a lapsed one."""
    _require_id(effect_key, "effect_key")
    _require_id(action_id, "action_id")
    if not isinstance(until, datetime) or until.utcoffset() is None:
        raise InvalidArgument(f"until must be a timezone-aware datetime, got {until!r}")
    if until <= now:
        raise InvalidArgument(f"until ({until.isoformat()}) must be in the future")
    if record is None:
        return _raise(AmbiguousEffect(effect_key=effect_key, action_id=action_id))
    if record.state is EffectState.COMMITTED:
        return _raise(DuplicateEffect(state="committed", effect_key=effect_key))
    live = lease_is_live(record, now)
    if live and (record.action_id != action_id or record.state is EffectState.RESERVED):
        return _raise(DuplicateEffect(state="in_progress", effect_key=effect_key))
    if not (live and record.state is EffectState.EXECUTING):
        return _raise(AmbiguousEffect(effect_key=effect_key, action_id=record.action_id))
    assert record.lease_expires_at is not None
    if until < record.lease_expires_at:
        raise InvalidArgument(
            f"until ({until.isoformat()}) is earlier than the current lease expiry "
            f"({record.lease_expires_at.isoformat()})"
        )
    return replace(record, lease_expires_at=until, updated_at=now)


def _raise(error: CTRLRunError) -> EffectRecord:
    raise error


def storable_text(value: Any) -> str:
    """``value`` as text UTF-8 can encode: lone surrogates become ``\\udcXX`` escapes."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error_text(error: Any) -> str | None:
    return None if error is None else storable_text(error)


_ASCII_JSON = json.JSONEncoder(ensure_ascii=True, allow_nan=False)
_ATOMS = (str, int, bool, type(None))


def storable_result(value: Any) -> Any:
    """The JSON value stored for an executor's result; an unencodable one becomes its ``repr``."""
    return stored_result(value)[0]


def stored_result(value: Any) -> tuple[Any, bool]:
    """``storable_result(value)``, and whether it equals ``value`` type for type (a replay of it
    would hand back what the function returned)."""
    if value is None or type(value) in _ATOMS:
        return value, True  # the JSON round trip gives these back unchanged
    if type(value) is dict and all(
        type(k) is str and type(v) in _ATOMS for k, v in value.items()
    ):  # fmt: skip
        return dict(value), True  # a flat object of those: likewise
    try:
        stored = json.loads(_ASCII_JSON.encode(value))
    except Exception:
        try:
            return storable_text(repr(value)), False
        except Exception:
            return f"<unrepresentable {type(value).__name__}>", False
    return stored, _same(value, stored)


def _same(value: Any, stored: Any) -> bool:
    """``value == stored`` with the same type at every level (a tuple stored as a list is not)."""
    if type(value) is not type(stored):
        return False
    if type(value) is dict:
        return value.keys() == stored.keys() and all(_same(v, stored[k]) for k, v in value.items())
    if type(value) is list:
        return len(value) == len(stored) and all(map(_same, value, stored))
    return bool(value == stored)


def check_line_text(value: Any, what: str) -> str:
    """Refuse a resolver/approver string that is empty, spans lines or holds control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    if len(value.splitlines()) != 1:
        raise InvalidArgument(f"{what} must be one line of text, got {value!r}")
    for char in value:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            raise InvalidArgument(
                f"{what} must not contain control or format characters "
                f"(found U+{ord(char):04X}) in {value!r}"
            )
    return value


def idempotency_token_for(effect_key: str, attempt: int) -> str:
    """The UUID a provider can dedupe one attempt of one effect on; it changes with the attempt."""
    if not isinstance(effect_key, str) or not effect_key:
        raise InvalidArgument(f"effect_key must be a non-empty string, got {effect_key!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidArgument(f"attempt must be an int >= 1, got {attempt!r}")
    document = {"attempt": attempt, "effect_key": effect_key, "schema": IDEMPOTENCY_SCHEMA}
    digest = bytearray(hashlib.sha256(canonical_bytes(document)).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))
