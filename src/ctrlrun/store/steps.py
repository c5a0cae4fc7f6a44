"""The store operations' shared steps, each written once over the row interface (``Tx``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..authority.ledger import Charge
from ..approvals.records import (
    Approval,
    ApprovalRecord,
    apply_consume,
    check_answerable,
    check_consumable,
)
from ..effects.records import (
    EffectRecord,
    EffectState,
    Reservation,
    fresh_reservation,
    new_record,
    plan_reservation,
)
from ..errors import (
    StoreUnavailable,
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
)
from ..evidence.drafts import EventRow, ReceiptDraft, event_from_row
from ..evidence.receipt import Event, Receipt
from . import codec
from .ledger import charge, release_on_failed
from .rows import KeptWrite, Tx


T = TypeVar("T")
EventsFn = Callable[[Approval | None, Reservation | None], Sequence[Event | EventRow]]
_CONTENDED = 8


# --------------------------------------------------------------------------- shared steps


def _reserve(
    tx: Tx,
    effect_key: str,
    action_id: str,
    lease: timedelta,
    now: datetime,
    state: EffectState,
    *,
    insert_first: bool = False,
    action_hash: str | None = None,
) -> Reservation:
    if insert_first:
        # A new key is the common case: insert the fresh record outright (the plan for "no
        # record"); only a conflict reads the record and plans from what is there.
        plan = plan_reservation(None, effect_key, action_id, lease, now, state=state,
                                action_hash=action_hash)  # fmt: skip
        assert plan.kind == "insert" and plan.write is not None
        if tx.insert_effect(plan.write):
            return plan.reservation
    for _ in range(2):
        record = tx.effect(effect_key)
        plan = plan_reservation(record, effect_key, action_id, lease, now, state=state,
                                action_hash=action_hash)  # fmt: skip
        if plan.kind == "refuse":
            assert plan.error is not None
            raise plan.error
        if plan.kind == "keep_then_refuse":
            assert plan.expected is not None and plan.write is not None and plan.error
            if tx.update_effect(plan.expected, plan.write):
                raise KeptWrite(plan.error)
            continue
        assert plan.write is not None
        if plan.kind == "insert":
            written = tx.insert_effect(plan.write)
        else:
            assert plan.expected is not None
            written = tx.update_effect(plan.expected, plan.write)
            if written and plan.expected.state is EffectState.RESERVED:
                # a lapsed reservation's function never ran: its charges go with it
                tx.release_consumptions(effect_key, now)
        if written:
            return plan.reservation
    raise DuplicateEffect(state="in_progress", effect_key=effect_key)


def _transition(
    tx: Tx, effect_key: str, decide: Callable[[EffectRecord | None], EffectRecord]
) -> EffectRecord:
    for _ in range(2):
        record = tx.effect(effect_key)
        updated = decide(record)
        assert record is not None
        if tx.update_effect(record, updated):
            if updated.state is EffectState.FAILED:
                release_on_failed(tx, updated)
            return updated
    raise DuplicateEffect(state="in_progress", effect_key=effect_key)


def _finishing(
    effect_key: str, action_id: str, decide: Callable[[EffectRecord | None], EffectRecord],
    now: datetime,
) -> tuple[EffectRecord, EffectRecord | None]:
    """The outcome of an attempt finishing the record its *start* left ``executing``, decided
    without reading it: the record as the caller knows it, and what to write (``None``: the
    record must be read and decided by ``_transition``).

    The finishing rules (``check_commit``/``check_fail``/``check_mark_ambiguous``) accept a
    record by its action id and state alone and change only its state, ``updated_at``, lease,
    result and error. So the outcome is decided on the record as the caller knows it (key,
    action id, ``executing``, no result or error yet) and written by one compare-and-set on
    exactly those values (``finish_effect``), keeping every other column as stored. Only when no
    row matches is the record read: the refusal (or the move from whatever state it is really
    in) is then decided on the stored record, as ``_transition`` does.
    """
    known = new_record(effect_key, EffectState.EXECUTING, action_id, 1, now, now, now)
    try:
        updated: EffectRecord = decide(known)
    except Exception:  # refused, or unwritable: decided again on the stored record
        return known, None
    # the rules change only state, updated_at, lease, result and error (what finish_effect
    # writes): anything else and the general path decides
    if (
        (updated.effect_key, updated.action_id, updated.attempt, updated.created_at)
        != (effect_key, action_id, 1, now)
        or updated.resolved_by is not None
    ):
        return known, None
    return known, updated


def _finish_and_record(
    tx: Tx,
    effect_key: str,
    action_id: str,
    decide: Callable[[EffectRecord | None], EffectRecord],
    now: datetime,
    rows: list[EventRow],
    receipt: Receipt | ReceiptDraft | None,
) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
    """The outcome written by compare-and-set (``_transition`` if it does not match), then the
    events and the receipt; with a receipt, the first three go in one step."""
    known, updated = _finishing(effect_key, action_id, decide, now)
    if updated is not None and isinstance(receipt, ReceiptDraft) and tx.places_receipts:
        # one message: the server places the receipt itself; when the outcome's
        # compare-and-set misses it writes nothing, and the stored record decides below
        placed = tx.finish_and_place(known, updated, rows, receipt)
        if placed is not None:
            ids, seq, prev_hash, digest = placed
            receipt.place(seq, prev_hash)  # the same line and hash, for whoever reads them
            if receipt.hash != digest:  # pragma: no cover - the two encoders agree by test
                raise CTRLRunError(
                    f"receipt {receipt.receipt_id} hashes to {receipt.hash} here but "
                    f"{digest} in the store; run `ctrlrun receipts --verify-chain`"
                )
            return _stored(tx, rows, ids), receipt
    if updated is not None and receipt is not None:
        _check_receipt(receipt)
        finished, ids, head = tx.finish_and_advance(known, updated, rows)
        if not finished:
            _transition(tx, effect_key, decide)
        elif updated.state is EffectState.FAILED:  # only the move to failed pays the release
            release_on_failed(tx, updated)
        return _stored(tx, rows, ids), _place_receipt(tx, receipt, head)
    if updated is None or not tx.finish_effect(known, updated):
        _transition(tx, effect_key, decide)
    elif updated.state is EffectState.FAILED:
        release_on_failed(tx, updated)
    return _record(tx, rows, receipt)


def _consumable(
    tx: Tx, approval_id: str, action_hash: str, now: datetime, action_id: str | None
) -> ApprovalRecord:
    for _ in range(2):
        record = tx.approval(approval_id)
        kept = check_consumable(record, approval_id, action_hash, now, action_id=action_id)
        if kept is None:
            assert record is not None
            return record
        if tx.update_approval(kept.expected, kept.write):
            raise KeptWrite(kept.error)
    raise ApprovalMismatch(reason="consumed", approval_id=approval_id)


def _answer(
    tx: Tx, approval_id: str, now: datetime, apply: Callable[[ApprovalRecord], ApprovalRecord]
) -> ApprovalRecord:
    for _ in range(_CONTENDED):
        record = tx.approval(approval_id)
        kept = check_answerable(record, approval_id, now)
        if kept is not None:
            if tx.update_approval(kept.expected, kept.write):
                raise KeptWrite(kept.error)
            continue
        assert record is not None
        updated = apply(record)
        if tx.update_approval(record, updated):
            return updated
    raise StoreUnavailable(f"approval {approval_id} is contended; nothing was written: try again")


def _start(
    tx: Tx,
    now: datetime,
    *,
    action_id: str,
    effect_key: str | None,
    lease: timedelta,
    approval_id: str | None,
    action_hash: str | None,
    state: EffectState,
    events: EventsFn | None,
    charges: Sequence[Charge] = (),
) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
    """Consume, reserve, charge, append the events. The reservation table decides first; the
    charges are checked (and written) only once it granted the key, and refuse it all."""
    record = approval = reservation = None
    if approval_id is not None:
        record = _consumable(tx, approval_id, action_hash or "", now, action_id)
        approval = record.as_approval()
    inserted_first = effect_key is not None and approval_id is None and events is not None
    if inserted_first:
        assert effect_key is not None and events is not None
        # The allow path: a new key is the common case, so the fresh record and the start's
        # events are written outright; only a taken key plans from what is there.
        if state not in (EffectState.RESERVED, EffectState.EXECUTING):
            raise InvalidArgument(f"a reservation is written reserved or executing, not {state}")
        written, fresh = fresh_reservation(effect_key, action_id, now + lease, now, state, action_hash)
        rows = event_rows(events(None, fresh), action_id, effect_key)
        ids = tx.reserve_new(written, rows, last=not charges)
        if ids is not None:
            if charges:
                charge(tx, charges, fresh, now, action_id)
            return None, fresh, _stored(tx, rows, ids)
    if effect_key is not None:
        try:
            # With an approval the key is read first (as before), so a race on the key is
            # decided after the approval's refusal can be checked; the allow path inserts.
            reservation = _reserve(
                tx, effect_key, action_id, lease, now, state,
                insert_first=approval_id is None and not inserted_first, action_hash=action_hash,
            )  # fmt: skip
        except (DuplicateEffect, AmbiguousEffect):
            if approval_id is not None:
                # Under READ COMMITTED another presenter may have consumed the approval while
                # this one waited on the key: the approval's refusal wins when both refuse.
                check_consumable(
                    tx.approval(approval_id), approval_id, action_hash or "", now,
                    action_id=action_id,
                )  # fmt: skip
            raise
        if charges:  # before the approval's row is locked: charging writers lock budgets first
            charge(tx, charges, reservation, now, action_id)
    if record is not None and not tx.update_approval(record, apply_consume(record, now)):
        raise ApprovalMismatch(reason="consumed", approval_id=approval_id)
    rows = event_rows(events(approval, reservation), action_id, effect_key, approval_id) if events is not None else []
    return approval, reservation, (_stored(tx, rows, tx.insert_events(rows)) if rows else ())


def event_rows(events: Sequence[Event | EventRow], *checked: str | None) -> list[EventRow]:
    """Events as the rows a store writes: an ``Event`` is checked and encoded, a row (what the
    Control builds from values it has checked) is taken as it is, each of its ids checked once
    unless it is one of ``checked`` (ids the caller has just checked itself)."""
    rows: list[EventRow] = []
    seen: set[Any] = {None, *checked}
    for event in events:
        if type(event) is tuple:
            row: EventRow = event
            if row[2] in seen and row[3] in seen and row[4] in seen:
                rows.append(row)  # the common case: ids the caller checked, or none
                continue
            for value in (row[2], row[3], row[4]):
                if value not in seen:
                    codec.check_text(value, "event id")
                    seen.add(value)
        else:
            row = codec.event_row(event)  # type: ignore[arg-type]
        rows.append(row)
    return rows


def _stored(tx: Tx, rows: Sequence[EventRow], ids: Sequence[int]) -> tuple[Event, ...]:
    """The events as stored, made into objects only when the caller asked for them back."""
    if not tx.returning or not rows:
        return ()
    return tuple(map(event_from_row, rows, ids))


def _check_receipt(receipt: Any) -> None:
    if isinstance(receipt, ReceiptDraft):
        return
    if not isinstance(receipt, Receipt):
        raise InvalidArgument(f"expected a Receipt, got {receipt!r}")
    if not isinstance(receipt.receipt_id, str) or not receipt.receipt_id:
        raise InvalidArgument(f"receipt_id must be a non-empty string, got {receipt.receipt_id!r}")


def _place_receipt(
    tx: Tx, receipt: Receipt | ReceiptDraft, head: tuple[int, str] | None
) -> Receipt | ReceiptDraft:
    if head is None:
        raise InvalidArgument(
            "the receipt chain head row is missing, so no receipt can be chained; "
            "the store was altered (run `ctrlrun receipts --verify-chain`)"
        )
    placed: Receipt | ReceiptDraft
    if isinstance(receipt, ReceiptDraft):
        receipt.place(*head)
        row = codec.draft_row(receipt)
        placed = receipt
    else:
        placed, document = receipt._placed(*head)
        row = codec.receipt_row(placed, document)
    if not tx.place_receipt(row, last=True):  # every caller returns next
        # The id is taken. Raising rolls the whole transaction back on every store: the head
        # moved above stays where it was, and nothing else of this write is kept.
        raise taken_receipt(receipt.receipt_id)
    return placed


def taken_receipt(receipt_id: str) -> InvalidArgument:
    """The refusal of a receipt whose id is stored already (raise it: nothing is kept)."""
    return InvalidArgument(f"receipt {receipt_id} is already stored; a receipt is written once")


def _record(
    tx: Tx, rows: list[EventRow], receipt: Receipt | ReceiptDraft | None
) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
    if receipt is None:
        return (_stored(tx, rows, tx.insert_events(rows)) if rows else ()), None
    _check_receipt(receipt)
    ids, head = tx.insert_events_and_advance_head(rows)
    return _stored(tx, rows, ids), _place_receipt(tx, receipt, head)


def _check_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    if "\x00" in value:  # no store can keep it (Postgres text refuses NUL), so none looks it up
        raise InvalidArgument(f"{what} holds a NUL character, which no store keeps: {value!r}")
    if not value.isascii():
        codec.check_text(value, what)
    return value


def _effect_state(state: Any) -> EffectState | None:
    if state is None:
        return None
    try:
        return EffectState(state)
    except ValueError:
        raise InvalidArgument(f"unknown effect state {state!r}") from None
