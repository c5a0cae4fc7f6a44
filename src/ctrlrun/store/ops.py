"""Every store operation, written once over a small row interface (``Tx``) backends supply."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..authority.ledger import Charge
from .._time import require_aware, utc_now
from ..action import Action
from ..approvals.records import (
    Approval,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStatus,
    VerifiedApprover,
    apply_consume,
    apply_deny,
    apply_grant,
)
from ..effects.records import (
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
)
from ..errors import (
    ApprovalMismatch,
    InvalidArgument,
)
from ..evidence.drafts import EventRow, ReceiptDraft, event_from_row
from ..evidence.receipt import Event, Receipt, UnreadableReceipt
from . import codec
from .ledger import charge, check_charges
from ..evidence.acts import ActKind
from .evidenceops import EvidenceOps, record_act
from .ledgerops import LedgerOps
from .reads import ReadOps
from .rows import KeptWrite, Tx, TxSteps
from .settle import Landed, finish_landed

__all__ = ["KeptWrite", "StoreOps", "Tx", "TxSteps"]  # the row interface is re-exported

T = TypeVar("T")
EventsFn = Callable[[Approval | None, Reservation | None], Sequence[Event | EventRow]]
from .steps import (  # noqa: F401  (the shared steps, written once)
    _CONTENDED,
    _reserve,
    _transition,
    _finishing,
    _finish_and_record,
    _consumable,
    _answer,
    _start,
    event_rows,
    _stored,
    _check_receipt,
    _place_receipt,
    _record,
    _check_id,
    _effect_state,
)


# --------------------------------------------------------------------------- the store API


class StoreOps(ReadOps, LedgerOps, EvidenceOps):
    """The whole store API over ``_write``/``_read``, which a backend implements.

    Beyond the ``StateStore`` protocol it offers what only tests, benchmarks and tools call: the
    single steps (``reserve_effect``, ``consume_approval_and_reserve``, ``begin_execution``,
    ``commit_effect``, ``fail_effect``, ``mark_ambiguous``, ``extend_lease``), the approval
    finders (``approvals_for``, ``find_granted_approval``, ``find_denied_request``), ``events``,
    ``append_event``,
    ``put_receipt`` and ``transactions`` (write transactions so far). Delegations and the
    budget ledger come from ``LedgerOps``; the paged and indexed reads (``iter_receipts``,
    ``last_receipts``, ``iter_effects``, ``receipts_for``, ``events_for``…) from ``ReadOps``.
    ``receipts()``, ``events()`` and ``list_effects()`` read the whole table: O(store).
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

    def _write_outcome(
        self, operation: Callable[[Tx, datetime], T], landed: Callable[[Tx, datetime], T | None]
    ) -> T:
        """``_write`` for an outcome (the function has run): a backend that can lose a write's
        answer retries it, and reads back with ``landed`` whether an unanswered one is kept."""
        return self._write(operation)

    def close(self) -> None:
        """Release connections; a later call opens fresh ones."""

    # -- effects

    def reserve_effect(
        self, effect_key: str, action_id: str, lease: timedelta = DEFAULT_LEASE, *,
        charges: Sequence[Charge] = (), action_hash: str | None = None,
    ) -> Reservation:  # fmt: skip
        """Reserve the key and take ``charges`` in one transaction, or write nothing: a
        refused reservation checks no charge, a charge that does not fit raises
        ``BudgetExhausted``. ``action_hash`` (the reserving action's) is kept on the record."""
        check_reservation_args(effect_key, action_id, lease)
        if action_hash is not None:
            _check_id(action_hash, "action_hash")
        checked = check_charges(charges, effect_key)

        def reserve(tx: Tx, now: datetime) -> Reservation:
            reservation = _reserve(tx, effect_key, action_id, lease, now, EffectState.RESERVED,
                                   action_hash=action_hash)  # fmt: skip
            charge(tx, checked, reservation, now, action_id)
            return reservation

        return self._write(reserve)

    def consume_approval_and_reserve(
        self,
        approval_id: str,
        action_hash: str,
        effect_key: str,
        action_id: str,
        lease: timedelta = DEFAULT_LEASE,
        *,
        charges: Sequence[Charge] = (),
    ) -> tuple[Approval, Reservation]:
        """Consume the approval, reserve the key and take ``charges`` in one transaction, or
        write nothing beyond a refusal's kept write; a refused charge leaves the approval
        granted."""
        _check_id(approval_id, "approval_id")
        _check_id(action_hash, "action_hash")
        check_reservation_args(effect_key, action_id, lease)
        checked = check_charges(charges, effect_key)
        approval, reservation, _ = self._write(
            lambda tx, now: _start(
                tx, now, action_id=action_id, effect_key=effect_key, lease=lease,
                approval_id=approval_id, action_hash=action_hash,
                state=EffectState.RESERVED, events=None, charges=checked,
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
        self, effect_key: str, state: EffectState | str, resolver: str, *,
        events: Callable[[EffectRecord, datetime], Sequence[Event]] | None = None,
    ) -> EffectRecord:
        """Settle an ambiguous effect; ``events`` (``ctrlrun.answers.resolve_events``) are
        written in the resolution's transaction."""
        check_line_text(resolver, "resolver")

        def resolve(tx: Tx, now: datetime) -> EffectRecord:
            record = _transition(tx, effect_key, lambda r: check_resolve(r, effect_key, state, resolver, now))
            _answered(tx, events, record, now)
            record_act(tx, now, ActKind.RESOLVE, effect_key, resolver, {
                "state": record.state.value, "attempt": record.attempt, "action_id": record.action_id,
            })  # fmt: skip
            return record

        return self._write(resolve)

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
        """Every effect (of ``state``) in creation order: O(store); ``iter_effects`` pages."""
        return tuple(self.iter_effects(state))

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
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> Approval | None:
        """Grant a pending request; with ``edited_action`` the grant binds the edited action.
        ``events`` (``ctrlrun.answers.answer_events``) are written in the grant's transaction."""
        _check_id(approval_id, "approval_id")
        check_line_text(approver, "approver")

        def grant(tx: Tx, now: datetime) -> ApprovalRecord:
            record = _answer(
                tx, approval_id, now,
                lambda r: apply_grant(r, approver, now, verified, edited_action=edited_action),
            )  # fmt: skip
            _answered(tx, events, record, now)
            kind = ActKind.GRANT if edited_action is None else ActKind.GRANT_EDITED
            record_act(tx, now, kind, approval_id, approver, {
                "action_hash": record.action_hash, "status": record.status.value,
                "edited_from": None if edited_action is None else record.request.action_hash,
                "verified": verified is not None,
            })  # fmt: skip
            return record

        record = self._write(grant)
        return record.as_approval() if record.status is ApprovalStatus.GRANTED else None

    def deny_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None,
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> None:
        """Deny a pending request; ``events`` are written in the denial's transaction."""
        _check_id(approval_id, "approval_id")
        check_line_text(approver, "approver")

        def deny(tx: Tx, now: datetime) -> None:
            record = _answer(tx, approval_id, now, lambda r: apply_deny(r, approver, now, verified))
            _answered(tx, events, record, now)
            record_act(tx, now, ActKind.DENY, approval_id, approver,
                       {"action_hash": record.action_hash, "verified": verified is not None})  # fmt: skip

        self._write(deny)

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
        """Every event: O(store); ``events_for`` reads one action's or request's by index."""
        return tuple(self._read(lambda tx, now: tx.list_events()))

    def put_receipt(self, receipt: Receipt) -> Receipt:
        stored = self.record(receipt=receipt)[1]
        assert isinstance(stored, Receipt)
        return stored

    def receipts(self) -> tuple[Receipt | UnreadableReceipt, ...]:
        """Every receipt in chain order: O(store); ``iter_receipts`` streams them a page at a
        time, ``last_receipts`` reads the tail."""
        return tuple(self.iter_receipts())

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
        charges: Sequence[Charge] = (),
    ) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
        """Consume the approval, reserve the key straight into ``executing``, take ``charges``,
        append the events (handed back stored, unless ``return_events`` is False: then
        ``()``)."""
        _check_id(action_id, "action_id")
        if approval_id is not None:
            _check_id(approval_id, "approval_id")
        if approval_id is not None or action_hash is not None:
            _check_id(action_hash, "action_hash")
        if effect_key is not None:
            _check_id(effect_key, "effect_key")
            check_reservation_args(effect_key, action_id, lease)
        checked = check_charges(charges, effect_key) if charges else ()

        def start(tx: Any, now: datetime) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
            tx.returning = return_events
            return _start(
                tx, now, action_id=action_id, effect_key=effect_key, lease=lease,
                approval_id=approval_id, action_hash=action_hash,
                state=EffectState.EXECUTING, events=events, charges=checked,
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

        def landed(tx: Any, now: datetime) -> Landed | None:
            return finish_landed(
                tx, effect_key=effect_key, action_id=action_id, outcome=target, rows=rows,
                receipt=receipt, return_events=return_events,
            )  # fmt: skip

        return self._write_outcome(finish, landed)

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


def _answered(tx: Tx, events: Callable[[Any, datetime], Sequence[Event]] | None, record: Any, now: datetime) -> None:
    """Write an answer's events with it (nothing when the caller gave none)."""
    if events is not None:
        rows = event_rows(events(record, now))
        if rows:
            tx.insert_events(rows)
