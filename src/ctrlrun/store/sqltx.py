"""The row operations of the SQL stores (``Tx``): compiled statements run on one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from itertools import chain
from typing import Any

from ..approvals.records import ApprovalRecord, ApprovalStatus
from ..effects.records import EffectRecord, EffectState
from ..evidence.drafts import ReceiptDraft
from ..errors import CTRLRunError, InvalidArgument
from ..evidence.drafts import EventRow, event_from_row
from ..evidence.receipt import Event, Receipt, UnreadableReceipt
from . import codec
from .evidencesql import EvidenceRows
from .ledgersql import LedgerRows
from .rows import TxSteps
from .statements import (
    APPROVAL_COLUMNS,
    EFFECT_COLUMNS,
    EVENT_COLUMNS,
    EVENTS_PER_STATEMENT,
    FINISH_COLUMNS,
    FINISH_WHERE,
    RECEIPT_COLUMNS,
    Compiled,
    Statements,
)

__all__ = ["SQLTx"]



class SQLTx(LedgerRows, EvidenceRows, TxSteps):
    """The row operations inside one transaction (or one read) of a ``Transaction``."""

    def __init__(self, transaction: Any, statements: Statements) -> None:
        self.sql = statements
        self._run = transaction.direct
        # sends a statement with the transaction's COMMIT, when the transaction can
        self._commits = transaction.run_and_commit if transaction.fused else None
        self._unique_error = transaction.unique_error
        self.places_receipts = statements.places and self._commits is not None

    def _go(self, statement: Compiled, values: dict[str, Any]) -> Any:
        return self._run(statement.sql, statement.bind(values))

    # effects
    def effect(self, effect_key: str) -> EffectRecord | None:
        row = self._run(self.sql.effect.sql, (effect_key,)).fetchone()
        return None if row is None else codec.effect_from_row(dict(zip(EFFECT_COLUMNS, row)))

    def insert_effect(self, record: EffectRecord) -> bool:
        # the driver's own row count: sqlite3 and psycopg both report one for an INSERT
        # (0 when the key exists)
        cursor = self._run(self.sql.insert_effect.sql, codec.effect_values(record))
        return bool(cursor.rowcount == 1)

    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        values = codec.effect_values(record)[1:] + (
            expected.effect_key, expected.state.value, expected.action_id, expected.attempt,
        )  # fmt: skip
        return bool(self._run(self.sql.update_effect.sql, values).rowcount == 1)

    def finish_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        values = _finish_values(expected, record)
        return bool(self._run(self.sql.finish_effect.sql, values).rowcount == 1)

    # approvals
    def approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._run(self.sql.approval.sql, (approval_id,)).fetchone()
        return None if row is None else codec.approval_from_row(dict(zip(APPROVAL_COLUMNS, row)))

    def insert_approval(self, record: ApprovalRecord) -> bool:
        # RETURNING, not rowcount: a conflict returns no row on both dialects
        row = self._go(self.sql.insert_approval, codec.approval_to_row(record)).fetchone()
        return row is not None

    def update_approval(self, expected: ApprovalRecord, record: ApprovalRecord) -> bool:
        values = codec.approval_to_row(record)
        values.update(w_id=expected.approval_id, w_status=expected.status.value,
                      w_approvers=codec.approvers_text(expected.approvers))  # fmt: skip
        return bool(self._go(self.sql.update_approval, values).rowcount == 1)

    def find_approvals(
        self,
        *,
        action_hash: str | None = None,
        status: ApprovalStatus | None = None,
        valid_at: datetime | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ApprovalRecord]:
        statement = self.sql.find_approvals(
            action_hash is not None, status is not None, valid_at is not None, newest_first,
            limit is not None,
        )  # fmt: skip
        values = {"hash": action_hash, "hash2": action_hash, "after": codec.ts(valid_at),
                  "status": status.value if status else None, "limit": limit,
                  "offset": 0}  # fmt: skip
        rows = self._go(statement, values).fetchall()
        return [codec.approval_from_row(dict(zip(APPROVAL_COLUMNS, r))) for r in rows]

    # events
    def insert_events(self, rows: Sequence[EventRow]) -> Sequence[int]:
        return self._insert_events(rows, advance_head=False)[0]

    def insert_events_and_advance_head(
        self, rows: Sequence[EventRow]
    ) -> tuple[Sequence[int], tuple[int, str] | None]:
        if not self.sql.combines or not rows or len(rows) > EVENTS_PER_STATEMENT:
            return self.insert_events(rows), self.advance_head()
        return self._insert_events(rows, advance_head=True)

    def _insert_events(
        self, rows: Sequence[EventRow], *, advance_head: bool
    ) -> tuple[Sequence[int], tuple[int, str] | None]:
        ids: list[int] = []
        head = None
        returning = self.returning or advance_head
        for start in range(0, len(rows), EVENTS_PER_STATEMENT):
            chunk = rows[start : start + EVENTS_PER_STATEMENT]
            statement = self.sql.insert_events(
                len(chunk), returning=returning, advance_head=advance_head
            )
            cursor = self._run(statement.sql, _flat(chunk))
            if not returning:  # nobody needs the ids: no RETURNING
                continue
            returned = cursor.fetchall()
            if advance_head:
                moved = [r for r in returned if r[0] == 1]
                head = (int(moved[0][1]), moved[0][2]) if moved else None
                returned = [r[1:] for r in returned if r[0] == 0]
            ids += _match_ids(chunk, returned)
        return ids, head

    def reserve_new(
        self, record: EffectRecord, rows: Sequence[EventRow], *, last: bool = False
    ) -> Sequence[int] | None:
        if not self.sql.combines or not rows or len(rows) > EVENTS_PER_STATEMENT:
            return super().reserve_new(record, rows)
        statement = self.sql.reserve_new(len(rows))
        values = statement.bind({**codec.effect_to_row(record), **_event_binds(rows)})
        run = self._commits if last and self._commits else self._run
        returned = run(statement.sql, values).fetchall()
        if not any(r[0] == 1 for r in returned):
            return None  # the key has a record: nothing was written
        if not self.returning:
            return ()
        return _match_ids(rows, [r[1:] for r in returned if r[0] == 0])

    def finish_and_advance(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow]
    ) -> tuple[bool, Sequence[int], tuple[int, str] | None]:
        if not self.sql.combines or not rows or len(rows) > EVENTS_PER_STATEMENT:
            return super().finish_and_advance(expected, record, rows)
        statement = self.sql.finish_and_advance(len(rows))
        values = dict(zip((*FINISH_COLUMNS, *FINISH_WHERE), _finish_values(expected, record)))
        values.update(_event_binds(rows))
        returned = self._run(statement.sql, statement.bind(values)).fetchall()
        moved = [r for r in returned if r[0] == 1]
        head = (int(moved[0][1]), moved[0][2]) if moved else None
        finished = any(r[0] == 2 for r in returned)
        if not self.returning:
            return finished, (), head
        return finished, _match_ids(rows, [r[1:] for r in returned if r[0] == 0]), head

    def finish_and_place(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow],
        draft: ReceiptDraft,
    ) -> tuple[Sequence[int], int, str, str] | None:  # fmt: skip
        """The whole finish in one message that commits (``Statements.finish_and_place``):
        the events' ids and the receipt's ``(seq, prev_hash, hash)``, or ``None`` when the
        compare-and-set missed and nothing was written. A taken receipt id writes nothing and
        is refused."""
        assert self._commits is not None
        statement = self.sql.finish_and_place(len(rows), release=record.state is EffectState.FAILED)
        values = dict(zip((*FINISH_COLUMNS, *FINISH_WHERE), _finish_values(expected, record)))
        values.update(zip(("l0", "l1", "l2", "c0", "c1", "c2"), draft.pieces()))
        values.update(_event_binds(rows))
        values.update(receipt_id=draft.receipt_id, action_id=draft.action_id,
                      effect_key=draft.effect_key, result=draft.result, ts=draft.finished_at,
                      approval_id=draft.approval_id)  # fmt: skip
        try:
            returned = self._commits(statement.sql, statement.bind(values)).fetchall()
        except self._unique_error as exc:
            if _constraint(exc) == "receipts_pkey":
                raise InvalidArgument(
                    f"receipt {draft.receipt_id} is already stored; a receipt is written once"
                ) from None
            raise
        placed = [r for r in returned if r[0] == 1]
        if not placed:
            return None
        ids = _match_ids(rows, [r[1:] for r in returned if r[0] == 0])
        _, seq, digest, prev = placed[0][:4]
        return ids, int(seq), prev, digest

    def list_events(self) -> list[Event]:
        rows = self._run(self.sql.list_events.sql, ()).fetchall()
        return [event_from_row(r[1:], int(r[0])) for r in rows]

    # receipts and the chain head
    def advance_head(self) -> tuple[int, str] | None:
        rows = self._run(self.sql.advance_head.sql, ()).fetchall()
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def place_receipt(self, row: tuple[Any, ...], *, last: bool = False) -> bool:
        sql = self.sql
        if last and self._commits and sql.place_receipt_strict is not None:
            try:
                return bool(self._commits(sql.place_receipt_strict.sql, row).rowcount == 1)
            except self._unique_error as exc:
                if _constraint(exc) == "receipts_pkey":
                    return False  # the id is taken: the transaction failed, nothing is kept
                raise
        if sql.place_receipt is not None:
            return bool(self._run(sql.place_receipt.sql, row).rowcount == 1)
        if self._run(sql.insert_receipt.sql, row).rowcount != 1:  # see insert_effect
            return False
        self._run(sql.set_head_hash.sql, (row[8],))
        return True

    def list_receipts(self) -> list[Receipt | UnreadableReceipt]:
        rows = self._run(self.sql.list_receipts.sql, ()).fetchall()
        return [codec.receipt_from_row(dict(zip(RECEIPT_COLUMNS, r))) for r in rows]

    def stored_receipt(self, receipt_id: str) -> tuple[str, str] | None:
        row = self._run(self.sql.stored_receipt.sql, (receipt_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def head(self) -> tuple[int, str] | None:
        row = self._run(self.sql.head.sql, ()).fetchone()
        return None if row is None else (int(row[0]), row[1])

    # paged and indexed reads
    def _receipts(self, statement: Compiled, values: dict[str, Any]) -> list[Receipt | UnreadableReceipt]:
        rows = self._go(statement, values).fetchall()
        return [codec.receipt_from_row(dict(zip(RECEIPT_COLUMNS, r))) for r in rows]

    def receipts_page(
        self, after: int | str, limit: int, *, chained: bool = True
    ) -> list[Receipt | UnreadableReceipt]:
        return self._receipts(self.sql.receipts_page(chained), {"after": after, "limit": limit})

    def receipts_tail(self, limit: int, *, chained: bool = True) -> list[Receipt | UnreadableReceipt]:
        return self._receipts(self.sql.receipts_tail(chained), {"limit": limit})

    def receipt_at_or_after(self, seq: int) -> tuple[int, str | None] | None:
        row = self._go(self.sql.receipt_at_or_after(), {"seq": seq}).fetchone()
        return None if row is None else (int(row[0]), row[1])

    def receipts_by(self, column: str, value: str) -> list[Receipt | UnreadableReceipt]:
        return self._receipts(self.sql.receipts_by(column), {"value": value})

    def events_by(self, column: str, value: str) -> list[Event]:
        rows = self._go(self.sql.events_by(column), {"value": value}).fetchall()
        return [event_from_row(r[1:], int(r[0])) for r in rows]

    def effects_page(
        self, state: EffectState | None, low: str | None, high: str | None,
        after: tuple[str, str] | None, limit: int,
    ) -> list[EffectRecord]:  # fmt: skip
        statement = self.sql.effects_page(state is not None, low is not None, high is not None,
                                          after is not None)  # fmt: skip
        values = {"state": state.value if state else None, "low": low, "high": high,
                  "a_created": after[0] if after else None, "a_key": after[1] if after else None,
                  "limit": limit}  # fmt: skip
        rows = self._go(statement, values).fetchall()
        return [codec.effect_from_row(dict(zip(EFFECT_COLUMNS, r))) for r in rows]


def _finish_values(expected: EffectRecord, record: EffectRecord) -> tuple[Any, ...]:
    """The finishing compare-and-set's values: what it writes, then what it expects."""
    return codec.finished_values(record) + (
        expected.effect_key, expected.action_id, expected.state.value,
    )  # fmt: skip


def _constraint(exc: BaseException) -> str | None:
    """The constraint a driver's integrity error names, when it says (psycopg does)."""
    return getattr(getattr(exc, "diag", None), "constraint_name", None)


def _event_binds(rows: Sequence[EventRow]) -> dict[str, Any]:
    """Event rows as the named parameters of a statement written for them (``ts_0``, …)."""
    return {f"{name}_{i}": value for i, row in enumerate(rows)
            for name, value in zip(EVENT_COLUMNS, row)}  # fmt: skip


def _flat(rows: Sequence[EventRow]) -> tuple[Any, ...]:
    return tuple(chain.from_iterable(rows))


def _match_ids(rows: Sequence[EventRow], returned: Sequence[Any]) -> list[int]:
    """The id the database gave each row, by content: the order of RETURNING rows is not
    guaranteed (SQLite says so). Rows equal in every column are interchangeable; they take
    their ids in ascending order."""
    if len(returned) != len(rows):
        raise CTRLRunError(f"the store returned {len(returned)} ids for {len(rows)} events")
    by_content: dict[tuple[Any, ...], list[int]] = {}
    for found in sorted(returned, key=lambda r: int(r[0]), reverse=True):
        by_content.setdefault(tuple(found[1:]), []).append(int(found[0]))
    try:
        return [by_content[tuple(row)].pop() for row in rows]
    except (KeyError, IndexError):
        raise CTRLRunError("the store returned event rows that differ from those written") from None
