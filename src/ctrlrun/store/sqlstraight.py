"""The straight path's two writes on a SQL store that sends one statement at a time (SQLite).

The same statements, in the same transactions, as the general path (``StoreOps.start_attempt``
and ``finish_attempt`` over the shared steps), written from the values ``straight`` checked and
built: *start* inserts the key's row straight into ``executing`` and its events; *finish* commits
it by compare-and-set, then writes its event, moves the chain head and places the receipt draft.
Whatever the general path would decide differently (a taken key, a record not as the start left
it) is decided there, by the same steps, inside the same transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .._time import format_precise
from ..effects.records import EffectState, Reservation, check_commit
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt
from . import codec
from .ops import EventsFn
from .settle import finish_landed
from .steps import _check_id, _place_receipt, _record, _reserve, _stored, _transition, event_rows, taken_receipt
from .straight import Finished, Started, StraightWrites, fresh_start

__all__ = ["SQLStraightWrites"]


class SQLStraightWrites(StraightWrites):
    """The two primitives on a ``SQLStateStore``: a statement each, decided in the transaction."""

    #: the chain head as this store last wrote it: the next receipt is placed after it by one
    #: compare-and-set, and read afresh when another writer has moved it since
    _known_head: tuple[int, str] | None = None

    def _start_straight(self, action_id: str, effect_key: str, lease: timedelta, action_hash: str | None,
                        events: EventsFn, return_events: bool) -> Started:  # fmt: skip
        store: Any = self

        def start(tx: Any, now: datetime) -> tuple[None, Reservation, tuple[Event, ...]]:
            tx.returning = return_events
            reservation, values, rows = fresh_start(now, effect_key, action_id, lease, action_hash, events)
            if tx._run(tx.sql.insert_effect.sql, values).rowcount != 1:
                # the key has a record: the reservation table decides on it, as the general
                # path does after its insert
                reservation = _reserve(tx, effect_key, action_id, lease, now,
                                       EffectState.EXECUTING, action_hash=action_hash)  # fmt: skip
                rows = event_rows(events(None, reservation), action_id, effect_key)
            if not return_events:  # no ids read back, no events made
                tx._insert_events(rows, advance_head=False)
                return None, reservation, ()
            return None, reservation, _stored(tx, rows, tx.insert_events(rows))

        return store._write(start)  # type: ignore[no-any-return]

    def _finish_straight(self, effect_key: str, action_id: str, result: Any, rows: list[EventRow],
                         result_columns: tuple[Any, Any], draft: ReceiptDraft,
                         return_events: bool) -> Finished:  # fmt: skip
        store: Any = self
        _check_id(action_id, "action_id")
        _check_id(effect_key, "effect_key")
        result_json, exact = result_columns

        def finish(tx: Any, now: datetime) -> tuple[tuple[Event, ...], ReceiptDraft | Receipt | None]:
            tx.returning = return_events
            committed = ("committed", None, result_json, None, format_precise(now), exact,
                         effect_key, action_id, "executing")  # fmt: skip
            if tx._run(tx.sql.finish_effect.sql, committed).rowcount == 1:
                if not return_events:  # no ids read back, no events made
                    tx._insert_events(rows, advance_head=False)
                    return (), self._chain(tx, draft)
                return _stored(tx, rows, tx.insert_events(rows)), self._chain(tx, draft)
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
