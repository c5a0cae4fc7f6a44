"""Every store operation, written once over a small row interface (``Tx``) backends supply."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .._time import require_aware, utc_now
from ..action import Action
from ..approvals import (
    Approval,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    VerifiedApprover,
    apply_consume,
    apply_deny,
    apply_grant,
    check_answerable,
    check_consumable,
)
from ..effect import (
    DEFAULT_LEASE,
    EffectRecord,
    EffectState,
    Reservation,
    check_begin,
    check_commit,
    check_extend_lease,
    check_fail,
    check_line_text,
    check_mark_ambiguous,
    check_reservation_args,
    check_resolve,
    plan_reservation,
)
from ..errors import (
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
)
from ..receipt import Event, EventRow, Receipt, ReceiptDraft, UnreadableReceipt, event_from_row
from . import codec
from .rows import KeptWrite, Tx, TxSteps

__all__ = ["KeptWrite", "StoreOps", "Tx", "TxSteps"]  # the row interface is re-exported

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
) -> Reservation:
    if insert_first:
        # A new key is the common case: insert the fresh record outright (the plan for "no
        # record"); only a conflict reads the record and plans from what is there.
        plan = plan_reservation(None, effect_key, action_id, lease, now, state=state)
        assert plan.kind == "insert" and plan.write is not None
        if tx.insert_effect(plan.write):
            return plan.reservation
    for _ in range(2):
        record = tx.effect(effect_key)
        plan = plan_reservation(record, effect_key, action_id, lease, now, state=state)
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
    known = EffectRecord(effect_key, EffectState.EXECUTING, action_id, 1, now, now, now)
    try:
        updated: EffectRecord | None = decide(known)
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
    if updated is not None and receipt is not None:
        _check_receipt(receipt)
        finished, ids, head = tx.finish_and_advance(known, updated, rows)
        if not finished:
            _transition(tx, effect_key, decide)
        return _stored(tx, rows, ids), _place_receipt(tx, receipt, head)
    if updated is None or not tx.finish_effect(known, updated):
        _transition(tx, effect_key, decide)
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
    raise CTRLRunError(f"approval {approval_id} is contended; try again")


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
) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
    record = approval = reservation = None
    if approval_id is not None:
        record = _consumable(tx, approval_id, action_hash or "", now, action_id)
        approval = record.as_approval()
    inserted_first = effect_key is not None and approval_id is None and events is not None
    if inserted_first:
        # The allow path: a new key is the common case, so the fresh record and the start's
        # events are written outright; only a taken key plans from what is there.
        plan = plan_reservation(None, effect_key, action_id, lease, now, state=state)
        assert plan.kind == "insert" and plan.write is not None
        rows = event_rows(events(None, plan.reservation), action_id, effect_key)
        ids = tx.reserve_new(plan.write, rows, last=True)
        if ids is not None:
            return None, plan.reservation, _stored(tx, rows, ids)
    if effect_key is not None:
        try:
            # With an approval the key is read first (as before), so a race on the key is
            # decided after the approval's refusal can be checked; the allow path inserts.
            reservation = _reserve(
                tx, effect_key, action_id, lease, now, state,
                insert_first=approval_id is None and not inserted_first,
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
        raise InvalidArgument(
            f"receipt {receipt.receipt_id} is already stored; a receipt is written once"
        )
    return placed


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


# --------------------------------------------------------------------------- the store API


class StoreOps:
    """The whole store API over ``_write``/``_read``, which a backend implements.

    Beyond the ``StateStore`` protocol it offers what only tests, benchmarks and tools call: the
    single steps (``reserve_effect``, ``consume_approval_and_reserve``, ``begin_execution``,
    ``commit_effect``, ``fail_effect``, ``mark_ambiguous``, ``extend_lease``), the approval
    finders (``approvals_for``, ``find_granted_approval``, ``find_denied_request``), ``events``,
    ``put_receipt`` and ``transactions`` (write transactions so far).
    """

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        if not callable(clock):
            raise InvalidArgument(f"clock must be a callable returning a datetime, got {clock!r}")
        self.clock = clock
        self.transactions = 0
        self._count_lock = threading.Lock()

    def _now(self) -> datetime:
        return require_aware(self.clock(), "the store clock's time")

    def _count(self) -> None:
        with self._count_lock:
            self.transactions += 1

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:  # pragma: no cover
        raise NotImplementedError

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        """Release connections; a later call opens fresh ones."""

    # -- effects

    def reserve_effect(
        self, effect_key: str, action_id: str, lease: timedelta = DEFAULT_LEASE
    ) -> Reservation:
        check_reservation_args(effect_key, action_id, lease)
        return self._write(
            lambda tx, now: _reserve(tx, effect_key, action_id, lease, now, EffectState.RESERVED)
        )

    def consume_approval_and_reserve(
        self,
        approval_id: str,
        action_hash: str,
        effect_key: str,
        action_id: str,
        lease: timedelta = DEFAULT_LEASE,
    ) -> tuple[Approval, Reservation]:
        _check_id(approval_id, "approval_id")
        _check_id(action_hash, "action_hash")
        check_reservation_args(effect_key, action_id, lease)
        approval, reservation, _ = self._write(
            lambda tx, now: _start(
                tx, now, action_id=action_id, effect_key=effect_key, lease=lease,
                approval_id=approval_id, action_hash=action_hash,
                state=EffectState.RESERVED, events=None,
            )
        )  # fmt: skip
        assert approval is not None and reservation is not None
        return approval, reservation

    def consume_approval(self, approval_id: str, action_hash: str) -> Approval:
        _check_id(approval_id, "approval_id")
        _check_id(action_hash, "action_hash")

        def consume(tx: Tx, now: datetime) -> Approval:
            record = _consumable(tx, approval_id, action_hash, now, None)
            if not tx.update_approval(record, apply_consume(record, now)):
                raise ApprovalMismatch(reason="consumed", approval_id=approval_id)
            return record.as_approval()

        return self._write(consume)

    def _move(self, effect_key: str, decide: Callable[..., EffectRecord]) -> EffectRecord:
        return self._write(lambda tx, now: _transition(tx, effect_key, lambda r: decide(r, now)))

    def begin_execution(self, effect_key: str, action_id: str) -> None:
        self._move(effect_key, lambda r, now: check_begin(r, effect_key, action_id, now))

    def commit_effect(self, effect_key: str, action_id: str, result: Any = None) -> None:
        self._move(effect_key, lambda r, now: check_commit(r, effect_key, action_id, result, now))

    def fail_effect(self, effect_key: str, action_id: str, error: str | None) -> None:
        self._move(effect_key, lambda r, now: check_fail(r, effect_key, action_id, error, now))

    def mark_ambiguous(self, effect_key: str, action_id: str, error: str | None) -> None:
        self._move(
            effect_key, lambda r, now: check_mark_ambiguous(r, effect_key, action_id, error, now)
        )

    def resolve_effect(
        self, effect_key: str, state: EffectState | str, resolver: str
    ) -> EffectRecord:
        check_line_text(resolver, "resolver")
        return self._move(
            effect_key, lambda r, now: check_resolve(r, effect_key, state, resolver, now)
        )

    def extend_lease(self, effect_key: str, action_id: str, until: datetime) -> None:
        if not isinstance(until, datetime) or until.utcoffset() is None:
            raise InvalidArgument(f"until must be a timezone-aware datetime, got {until!r}")
        self._move(
            effect_key, lambda r, now: check_extend_lease(r, effect_key, action_id, until, now)
        )

    def get_effect(self, effect_key: str) -> EffectRecord | None:
        _check_id(effect_key, "effect_key")
        return self._read(lambda tx, now: tx.effect(effect_key))

    def list_effects(self, state: EffectState | str | None = None) -> tuple[EffectRecord, ...]:
        wanted = _effect_state(state)
        return tuple(self._read(lambda tx, now: tx.list_effects(wanted)))

    # -- approvals

    def put_approval_request(self, request: ApprovalRequest) -> None:
        if not isinstance(request, ApprovalRequest):
            raise InvalidArgument(f"expected an ApprovalRequest, got {request!r}")

        def put(tx: Tx, now: datetime) -> None:
            if not tx.insert_approval(ApprovalRecord(request)):
                raise InvalidArgument(
                    f"approval request {request.request_id} already exists; request ids are "
                    "never reused"
                )

        self._write(put)

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        _check_id(approval_id, "approval_id")
        return self._read(lambda tx, now: tx.approval(approval_id))

    def grant_approval(
        self,
        approval_id: str,
        approver: str,
        *,
        verified: VerifiedApprover | None = None,
        edited_action: Action | None = None,
    ) -> Approval | None:
        """Grant a pending request; with ``edited_action`` the grant binds the edited action."""
        _check_id(approval_id, "approval_id")
        check_line_text(approver, "approver")
        record = self._write(
            lambda tx, now: _answer(
                tx,
                approval_id,
                now,
                lambda r: apply_grant(r, approver, now, verified, edited_action=edited_action),
            )
        )
        return record.as_approval() if record.status is ApprovalStatus.GRANTED else None

    def deny_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None
    ) -> None:
        _check_id(approval_id, "approval_id")
        check_line_text(approver, "approver")
        self._write(
            lambda tx, now: _answer(
                tx, approval_id, now, lambda r: apply_deny(r, approver, now, verified)
            )
        )

    def pending_approvals(self, limit: int | None = None) -> tuple[ApprovalRecord, ...]:
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidArgument(f"limit must be None or an int >= 0, got {limit!r}")
        return tuple(
            self._read(
                lambda tx, now: tx.find_approvals(
                    status=ApprovalStatus.PENDING, valid_at=now, limit=limit
                )
            )
        )

    def approvals_for(self, action_hash: str) -> tuple[ApprovalRecord, ...]:
        _check_id(action_hash, "action_hash")
        return tuple(self._read(lambda tx, now: tx.find_approvals(action_hash=action_hash)))

    def _newest(self, action_hash: str, status: ApprovalStatus) -> ApprovalRecord | None:
        _check_id(action_hash, "action_hash")
        found = self._read(
            lambda tx, now: tx.find_approvals(
                action_hash=action_hash, status=status, valid_at=now, newest_first=True, limit=1
            )
        )
        return found[0] if found else None

    def find_granted_approval(self, action_hash: str) -> Approval | None:
        record = self._newest(action_hash, ApprovalStatus.GRANTED)
        return None if record is None else record.as_approval()

    def find_denied_request(self, action_hash: str) -> ApprovalRequest | None:
        record = self._newest(action_hash, ApprovalStatus.DENIED)
        return None if record is None else record.request

    # -- evidence

    def append_event(self, event: Event) -> Event:
        if not isinstance(event, Event):
            raise InvalidArgument(f"expected an Event, got {event!r}")
        return self._write(_append_one(event))

    def events(self) -> tuple[Event, ...]:
        return tuple(self._read(lambda tx, now: tx.list_events()))

    def put_receipt(self, receipt: Receipt) -> Receipt:
        stored = self.record(receipt=receipt)[1]
        assert isinstance(stored, Receipt)
        return stored

    def receipts(self) -> tuple[Receipt | UnreadableReceipt, ...]:
        return tuple(self._read(lambda tx, now: tx.list_receipts()))

    def chain_head(self) -> tuple[int, str] | None:
        return self._read(lambda tx, now: tx.head())

    # -- combined operations (one transaction each)

    def start_attempt(
        self,
        *,
        action_id: str,
        effect_key: str | None,
        lease: timedelta = DEFAULT_LEASE,
        approval_id: str | None = None,
        action_hash: str | None = None,
        events: EventsFn | None = None,
        return_events: bool = True,
    ) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
        """Consume the approval, reserve the key straight into ``executing``, append the events
        (handed back stored, unless ``return_events`` is False: then ``()``)."""
        _check_id(action_id, "action_id")
        if approval_id is not None:
            _check_id(approval_id, "approval_id")
            _check_id(action_hash, "action_hash")
        if effect_key is not None:
            _check_id(effect_key, "effect_key")
            check_reservation_args(effect_key, action_id, lease)

        def start(tx: Any, now: datetime) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
            tx.returning = return_events
            return _start(
                tx, now, action_id=action_id, effect_key=effect_key, lease=lease,
                approval_id=approval_id, action_hash=action_hash,
                state=EffectState.EXECUTING, events=events,
            )  # fmt: skip

        return self._write(start)

    def finish_attempt(
        self,
        *,
        effect_key: str | None,
        action_id: str,
        outcome: EffectState | str | None,
        result: Any = None,
        error: str | None = None,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Write the outcome, append events, chain the receipt; a refused outcome writes nothing.
        The events come back stored unless ``return_events`` is False (then ``()``); a
        ``ReceiptDraft`` comes back placed (its ``receipt()`` makes the object)."""
        _check_id(action_id, "action_id")
        target = _effect_state(outcome)
        if (target is None) != (effect_key is None):
            raise InvalidArgument(
                "finish_attempt needs an outcome exactly when it has an effect key"
            )
        if target is not None and target not in _FINISHES:
            raise InvalidArgument(
                f"an attempt finishes committed, failed or ambiguous, not {target}"
            )
        if effect_key is not None:
            _check_id(effect_key, "effect_key")
        rows = event_rows(events, action_id, effect_key)

        def finish(
            tx: Any, now: datetime
        ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
            tx.returning = return_events
            if target is None:
                return _record(tx, rows, receipt)
            assert effect_key is not None
            check = _FINISHES[target]
            value = error if target is not EffectState.COMMITTED else result
            decide = lambda r: check(r, effect_key, action_id, value, now)  # noqa: E731
            return _finish_and_record(tx, effect_key, action_id, decide, now, rows, receipt)

        return self._write(finish)

    def record(
        self,
        *,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Append events and chain a receipt in one transaction."""
        rows = event_rows(events)

        def write(tx: Any, now: datetime) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
            tx.returning = return_events
            return _record(tx, rows, receipt)

        return self._write(write)


_FINISHES: dict[EffectState, Callable[..., EffectRecord]] = {
    EffectState.COMMITTED: check_commit,
    EffectState.FAILED: check_fail,
    EffectState.AMBIGUOUS: check_mark_ambiguous,
}


def _append_one(event: Event) -> Callable[[Tx, datetime], Event]:
    row = codec.event_row(event)

    def append(tx: Tx, now: datetime) -> Event:
        tx.returning = True
        (event_id,) = tx.insert_events([row])
        return event_from_row(row, event_id)

    return append
