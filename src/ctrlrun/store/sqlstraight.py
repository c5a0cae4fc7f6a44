"""The allowed call's two writes on a SQL store that sends one statement at a time (SQLite).

The same statements, in the same transactions, as the general path (``StoreOps.start_attempt``
and ``finish_attempt`` over the shared steps), written from checked values instead of records:
*start* inserts the key's row straight into ``executing`` and its events; *finish* commits it by
compare-and-set, then writes its event, moves the chain head and places the receipt draft.
Whatever the general path would decide differently (a taken key, a record not as the start
left it) is decided there, by the same steps, inside the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ..authority.ledger import Charge
from .._time import format_precise
from ..approvals.records import Approval
from ..evidence.drafts import EventRow, ReceiptDraft
from ..effects.records import DEFAULT_LEASE, EffectState, Reservation, check_commit, new_reservation
from ..evidence.receipt import Event, Receipt
from . import codec
from .ops import EventsFn
from .settle import finish_landed
from .steps import (
    _check_id,
    _place_receipt,
    _record,
    _reserve,
    _stored,
    _transition,
    event_rows,
    taken_receipt,
)

__all__ = ["StraightWrites"]

_ZERO = timedelta(0)


class StraightWrites:
    """``start_attempt`` and ``finish_attempt`` for the allowed call, on a ``SQLStateStore``."""

    #: the chain head as this store last wrote it: the next receipt is placed after it by one
    #: compare-and-set, and read afresh when another writer has moved it since
    _known_head: tuple[int, str] | None = None

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
        store: Any = self
        if (
            approval_id is not None or type(effect_key) is not str or events is None or charges
            or type(lease) is not timedelta or lease <= _ZERO
        ):  # fmt: skip
            return super().start_attempt(  # type: ignore[misc, no-any-return]
                action_id=action_id, effect_key=effect_key, lease=lease, approval_id=approval_id,
                action_hash=action_hash, events=events, return_events=return_events,
                charges=charges,
            )  # fmt: skip
        _check_id(action_id, "action_id")
        _check_id(effect_key, "effect_key")
        if action_hash is not None:
            _check_id(action_hash, "action_hash")

        def start(tx: Any, now: datetime) -> tuple[None, Reservation, tuple[Event, ...]]:
            tx.returning = return_events
            until = now + lease
            reservation = new_reservation(effect_key, action_id, 1, until)
            at = format_precise(now)  # the expiry formatted last: the start event's lease reuses it
            values = codec.fresh_effect_values(
                effect_key, EffectState.EXECUTING, action_id, format_precise(until), at, action_hash
            )  # fmt: skip
            rows = event_rows(events(None, reservation), action_id, effect_key)
            if tx._run(tx.sql.insert_effect.sql, values).rowcount != 1:
                # the key has a record: the reservation table decides on it, as the general
                # path does after its insert
                reservation = _reserve(tx, effect_key, action_id, lease, now,
                                       EffectState.EXECUTING, action_hash=action_hash)  # fmt: skip
                rows = event_rows(events(None, reservation), action_id, effect_key)
            return None, reservation, _stored(tx, rows, tx.insert_events(rows))

        return store._write(start)  # type: ignore[no-any-return]

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
        store: Any = self
        if (
            outcome is not EffectState.COMMITTED or type(effect_key) is not str
            or type(receipt) is not ReceiptDraft or receipt.action_id != action_id
            or receipt.effect_key != effect_key
        ):  # fmt: skip
            return super().finish_attempt(  # type: ignore[misc, no-any-return]
                effect_key=effect_key, action_id=action_id, outcome=outcome, result=result,
                error=error, events=events, receipt=receipt, return_events=return_events,
            )  # fmt: skip
        _check_id(action_id, "action_id")
        _check_id(effect_key, "effect_key")
        draft: ReceiptDraft = receipt
        rows = event_rows(events, action_id, effect_key)
        result_json, exact = codec.result_columns(result)

        def finish(tx: Any, now: datetime) -> tuple[tuple[Event, ...], ReceiptDraft | Receipt | None]:
            tx.returning = return_events
            committed = ("committed", None, result_json, None, format_precise(now), exact,
                         effect_key, action_id, "executing")  # fmt: skip
            if tx._run(tx.sql.finish_effect.sql, committed).rowcount == 1:
                ids = tx.insert_events(rows)
                return _stored(tx, rows, ids), self._chain(tx, draft)
            # not as the start left it: decided on the stored record, as the general path does
            _transition(tx, effect_key, lambda r: check_commit(r, effect_key, action_id, result, now))
            return _record(tx, rows, draft)

        def landed(tx: Any, now: datetime) -> Any:
            return finish_landed(
                tx, effect_key=effect_key, action_id=action_id, outcome=EffectState.COMMITTED,
                rows=rows, receipt=draft, return_events=return_events,
            )  # fmt: skip

        return store._write_outcome(finish, landed)  # type: ignore[no-any-return]

    def _chain(self, tx: Any, draft: ReceiptDraft) -> ReceiptDraft:
        """Place ``draft`` at the head of the chain and move the head past it."""
        known = self._known_head
        if known is not None:
            seq, previous = known
            digest = draft.place(seq + 1, previous)[1]
            if tx._run(tx.sql.move_head.sql, (seq + 1, digest, seq, previous)).rowcount == 1:
                if tx._run(tx.sql.insert_receipt.sql, codec.draft_row(draft)).rowcount != 1:
                    raise taken_receipt(draft.receipt_id)  # rolled back: the head stays
                self._known_head = (seq + 1, digest)  # a lost commit leaves it behind: a miss
                return draft
        head = tx.advance_head()  # the head as stored, moved (None: the row is gone)
        _place_receipt(tx, draft, head)
        assert head is not None and draft.hash is not None
        self._known_head = (head[0], draft.hash)
        return draft
