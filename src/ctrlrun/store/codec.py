"""Rows in and out: how every store encodes records into column values and reads them back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .._time import format_precise, parse_ts
from ..action import _flat_text, action_from_dict, action_to_dict, encoder_of
from ..approvals.records import ApprovalRecord, ApprovalRequest, ApprovalStatus, VerifiedApprover
from ..effects.records import EffectRecord, EffectState, new_record, stored_result
from ..errors import InvalidArgument
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt, _compact, receipt_from_row

__all__ = [
    "approval_from_row",
    "approval_to_row",
    "approvers_text",
    "dumps",
    "effect_from_row",
    "effect_to_row",
    "event_from_row",
    "event_to_row",
    "receipt_from_row",
    "receipt_to_row",
    "ts",
]


def ts(moment: datetime | None) -> str | None:
    """A timestamp column value: full-precision UTC ISO text, which sorts like the time."""
    return None if moment is None else format_precise(moment)


def _time(text: str | None) -> datetime | None:
    return None if text is None else parse_ts(text)


_UTF8_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_utf8_text = encoder_of(_UTF8_JSON)
_ASCII_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dumps(value: Any, what: str) -> str:
    """Compact JSON text for a column; escapes non-ASCII only when UTF-8 cannot carry it."""
    if type(value) is dict:
        text = _flat_text(value, sort=False)  # the commonest result: a flat ASCII object
        if text is not None:
            return text
    try:
        text = _utf8_text(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} is not JSON-encodable: {exc}") from None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _ASCII_JSON.encode(value)
    return text


def _text(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if type(value) is str and value.isascii() and "\x00" not in value:
        return value  # the common case: nothing to refuse
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {value!r}")
    if not value.isascii():  # ASCII is UTF-8 already
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{what} holds a lone surrogate and cannot be stored") from None
    if "\x00" in value:
        # Postgres text cannot hold NUL; every backend refuses it so none permits more.
        raise InvalidArgument(f"{what} holds a NUL character and cannot be stored: {value!r}")
    return value


def _free_text(value: str | None, what: str) -> str | None:
    """Free text (an error message, a copied column): NUL is written as the escape ``\\x00``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {value!r}")
    return _text(value.replace("\x00", "\\x00"), what)


def effect_values(record: EffectRecord) -> tuple[Any, ...]:
    """``effect_to_row(record)``'s values, in the table's column order."""
    result = record.result
    return (
        _text(record.effect_key, "effect_key"),
        record.state._value_,  # .value, without the enum's property
        _text(record.action_id, "action_id"),
        record.attempt,
        None if record.lease_expires_at is None else format_precise(record.lease_expires_at),
        None if result is None else dumps(result, "result"),
        None if record.error is None else _free_text(record.error, "error"),
        format_precise(record.created_at),
        format_precise(record.updated_at),
        None if record.resolved_by is None else _text(record.resolved_by, "resolved_by"),
        None if record.action_hash is None else _text(record.action_hash, "action_hash"),
        1 if record.result_exact else 0,
    )


def finished_values(record: EffectRecord) -> tuple[Any, ...]:
    """What a finishing compare-and-set writes, in column order: state, lease, result, error,
    updated_at, result_exact."""
    result = record.result
    return (
        record.state._value_,  # .value, without the enum's property
        None if record.lease_expires_at is None else format_precise(record.lease_expires_at),
        None if result is None else dumps(result, "result"),
        None if record.error is None else _free_text(record.error, "error"),
        format_precise(record.updated_at),
        1 if record.result_exact else 0,
    )


def result_columns(result: Any) -> tuple[str | None, int]:
    """A returned value's ``result_json`` and ``result_exact`` columns: what ``stored_result``
    and ``dumps`` give it, written straight for the commonest result (a flat ASCII object)."""
    if type(result) is dict:
        text = _flat_text(result, sort=False)
        if text is not None:
            return text, 1  # str keys and str/int/bool/None values: stored exactly as returned
    stored, exact = stored_result(result)
    return (None if stored is None else dumps(stored, "result")), (1 if exact else 0)


def fresh_effect_values(
    effect_key: str, state: EffectState, action_id: str, until: str, at: str, action_hash: str | None
) -> tuple[Any, ...]:
    """``effect_values`` of the record a key without one gets (attempt 1, leased ``until``),
    its ids already checked and its moments formatted."""
    return (effect_key, state._value_, action_id, 1, until, None, None, at, at, None, action_hash, 0)


EFFECT_FIELDS = ("effect_key", "state", "action_id", "attempt", "lease_expires_at",
                 "result_json", "error", "created_at", "updated_at", "resolved_by",
                 "action_hash", "result_exact")  # fmt: skip
FINISHED_FIELDS = ("state", "lease_expires_at", "result_json", "error", "updated_at", "result_exact")


def effect_to_row(record: EffectRecord) -> dict[str, Any]:
    return dict(zip(EFFECT_FIELDS, effect_values(record)))


def effect_from_row(row: Mapping[str, Any]) -> EffectRecord:
    result = row["result_json"]
    return new_record(
        effect_key=row["effect_key"],
        state=EffectState(row["state"]),
        action_id=row["action_id"],
        attempt=int(row["attempt"]),
        created_at=parse_ts(row["created_at"]),
        updated_at=parse_ts(row["updated_at"]),
        lease_expires_at=_time(row["lease_expires_at"]),
        result=None if result is None else json.loads(result),
        error=row["error"],
        resolved_by=row["resolved_by"],
        action_hash=row.get("action_hash"),
        result_exact=bool(row.get("result_exact")),
    )


def approvers_text(approvers: tuple[VerifiedApprover, ...]) -> str:
    """The ``approvers`` column value (deterministic, so it can be compared-and-set)."""
    return dumps([a.to_dict() for a in approvers], "approvers")


def approval_to_row(record: ApprovalRecord) -> dict[str, Any]:
    request = record.request
    return {
        "approval_id": _text(request.request_id, "request_id"),
        "action_hash": _text(request.action_hash, "action_hash"),
        "status": record.status.value,
        "action_json": dumps(action_to_dict(request.action), "action"),
        "approver": _text(record.approver, "approver"),
        "created_at": ts(request.created_at),
        "granted_at": ts(record.granted_at),
        "expires_at": ts(request.expires_at),
        "consumed_at": ts(record.consumed_at),
        "policy_hash_at_approval": _text(request.policy_hash, "policy_hash"),
        "precondition_fingerprint": _text(
            request.precondition_fingerprint, "precondition_fingerprint"
        ),
        "approvers": approvers_text(record.approvers),
        "required_roles": dumps(list(request.required_roles), "required_roles"),
        "approvals_required": request.approvals_required,
        "edited_action_json": (
            None if record.edited_action is None
            else dumps(action_to_dict(record.edited_action), "edited action")
        ),
        "edited_action_hash": (
            None if record.edited_action is None else record.edited_action.action_hash
        ),
    }


def _json_list(text: Any, what: str, approval_id: str) -> list[Any]:
    if text is None:
        return []
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, list):
        raise InvalidArgument(
            f"approval {approval_id}: the stored {what} column is corrupted ({text!r}); "
            "the approval cannot be used"
        )
    return value


def approval_from_row(row: Mapping[str, Any]) -> ApprovalRecord:
    """Rebuild a record; a corrupted column refuses (fail closed) with ``InvalidArgument``."""
    approval_id = row["approval_id"]
    roles = _json_list(row["required_roles"], "required_roles", approval_id)
    listed = _json_list(row["approvers"], "approvers", approval_id)
    required = row["approvals_required"]
    try:
        action = action_from_dict(json.loads(row["action_json"]))
        approvers = tuple(VerifiedApprover.from_dict(item) for item in listed)
        request = ApprovalRequest(
            request_id=approval_id,
            action_hash=row["action_hash"],
            action=action,
            created_at=parse_ts(row["created_at"]),
            expires_at=parse_ts(row["expires_at"]),
            policy_hash=row["policy_hash_at_approval"],
            precondition_fingerprint=row["precondition_fingerprint"],
            required_roles=tuple(roles),
            approvals_required=1 if required is None else required,
        )
        return ApprovalRecord(
            request=request,
            status=ApprovalStatus(row["status"]),
            approver=row["approver"],
            granted_at=_time(row["granted_at"]),
            consumed_at=_time(row["consumed_at"]),
            approvers=approvers,
            edited_action=(
                None if row.get("edited_action_json") is None
                else action_from_dict(json.loads(row["edited_action_json"]))
            ),
        )
    except Exception as exc:
        raise InvalidArgument(
            f"approval {approval_id}: the stored record is unreadable ({exc}); "
            "the approval cannot be used"
        ) from None


def event_to_row(event: Event) -> dict[str, Any]:
    if not isinstance(event, Event):
        raise InvalidArgument(f"expected an Event, got {event!r}")
    return {
        "ts": _text(event.ts, "event ts"),
        "type": event.type.value,
        "action_id": _text(event.action_id, "event action_id"),
        "effect_key": _text(event.effect_key, "event effect_key"),
        "approval_id": _text(event.approval_id, "event approval_id"),
        "data_json": dumps(dict(event.data), f"{event.type.value} event data"),
    }


def check_text(value: str | None, what: str) -> None:
    """Refuse text no store can keep (NUL, a lone surrogate), so no backend keeps more."""
    _text(value, what)


def event_row(event: Event) -> EventRow:
    """An ``Event`` as the row tuple every store writes (checked, data encoded)."""
    if not isinstance(event, Event):
        raise InvalidArgument(f"expected an Event, got {event!r}")
    return (
        _text(event.ts, "event ts"),  # type: ignore[return-value]
        event.type.value,
        _text(event.action_id, "event action_id"),
        _text(event.effect_key, "event effect_key"),
        _text(event.approval_id, "event approval_id"),
        dumps(dict(event.data), f"{event.type.value} event data"),
    )


def receipt_row(receipt: Receipt, document: dict[str, Any]) -> tuple[Any, ...]:
    """A placed receipt's row, in the table's column order (see ``receipt_to_row``)."""
    row = receipt_to_row(receipt, document)
    return tuple(row[c] for c in RECEIPT_ROW)


def draft_row(draft: ReceiptDraft) -> tuple[Any, ...]:
    """The row of a placed ``ReceiptDraft`` (its values were checked when it was built)."""
    return (
        draft.receipt_id,
        _free_text(draft.action_id, "receipt action_id"),
        _free_text(draft.effect_key, "receipt effect_key"),
        draft.result,
        draft.line,
        draft.finished_at,
        int(draft.values["seq"]),
        draft.values["prev_hash"][1:-1],
        draft.hash,
        draft.approval_id,
    )


RECEIPT_ROW = ("receipt_id", "action_id", "effect_key", "result", "json", "ts", "seq",
                "prev_hash", "hash", "approval_id")  # fmt: skip


def event_from_row(row: Mapping[str, Any]) -> Event:
    return Event(
        type=row["type"],
        ts=row["ts"],
        action_id=row["action_id"],
        effect_key=row["effect_key"],
        approval_id=row["approval_id"],
        data=json.loads(row["data_json"]),
        event_id=int(row["event_id"]),
    )


_PLAIN = frozenset((str, int, bool, type(None)))


def stored_event(event: Event, row: Mapping[str, Any], event_id: int) -> Event:
    """``event`` as a store returns it once written as ``row`` under ``event_id``: what
    ``event_from_row`` would read back, without decoding the row when the data is flat."""
    data = event.data
    if all(type(value) in _PLAIN for value in data.values()):
        stored = object.__new__(Event)
        put = object.__setattr__
        put(stored, "type", event.type)
        put(stored, "ts", event.ts)
        put(stored, "action_id", event.action_id)
        put(stored, "effect_key", event.effect_key)
        put(stored, "approval_id", event.approval_id)
        put(stored, "data", dict(data))
        put(stored, "event_id", event_id)
        return stored
    return event_from_row({**row, "event_id": event_id})


def receipt_to_row(receipt: Receipt, document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row of a receipt already placed in the chain (``seq``, ``prev_hash``, ``hash`` set).

    ``document`` is ``receipt.to_dict()`` when the caller has it already (``Receipt._placed``).
    """
    text = receipt.to_json() if document is None else _compact(document)
    _text(text, f"receipt {receipt.receipt_id}")
    object.__setattr__(receipt, "_json", text)  # to_json() of this receipt, for the sinks
    return {
        "receipt_id": _text(receipt.receipt_id, "receipt_id"),
        "action_id": _free_text(receipt.action_id, "receipt action_id"),
        "effect_key": _free_text(receipt.effect_key, "receipt effect_key"),
        "result": _free_text(receipt.result, "receipt result"),
        "json": text,
        "ts": _free_text(receipt.finished_at, "receipt finished_at"),
        "seq": receipt.seq,
        "prev_hash": receipt.prev_hash,
        "hash": receipt.hash,
        "approval_id": _free_text(receipt.approval_id, "receipt approval_id"),
    }
