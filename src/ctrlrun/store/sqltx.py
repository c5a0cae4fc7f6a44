"""The row operations of the SQL stores (``Tx``) over one connection inside one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, or_, select, update

from ..approvals import ApprovalRecord, ApprovalStatus
from ..effect import EffectRecord, EffectState
from ..errors import CTRLRunError
from ..receipt import Event, Receipt, UnreadableReceipt
from . import codec
from .rows import TxSteps
from .schema import approvals, effects, events, receipt_chain, receipts
from .statements import (
    EFFECT_COLUMNS,
    EVENTS_PER_STATEMENT,
    Statements,
    effect_values,
    event_values,
    receipt_values,
)

__all__ = ["SQLTx"]


class SQLTx(TxSteps):
    """The row operations over one SQLAlchemy connection inside the caller's transaction.

    A ``transaction`` begun on the driver (``DirectWrite``) sends the hot statements straight
    to the driver, and may send the last one with its ``COMMIT``; without it they go through
    ``exec_driver_sql``. Both answer with something that has ``rowcount``, ``fetchone`` and
    ``fetchall``.
    """

    def __init__(self, conn: Connection, statements: Statements, transaction: Any = None) -> None:
        self.conn = conn
        self.sql = statements
        self._insert = statements.insert
        run = getattr(transaction, "run", None)
        self._run = conn.exec_driver_sql if run is None else run
        # sends a statement with the transaction's COMMIT, when the transaction can
        self._commits = getattr(transaction, "run_and_commit", None)
        self._unique_error = getattr(transaction, "unique_error", ())
        self._begun = getattr(transaction, "begin_now", None)

    def _core(self, statement: Any) -> Any:
        """Run a SQLAlchemy Core statement inside this transaction (a deferred BEGIN is sent
        first, so a write made this way is never outside it)."""
        if self._begun is not None:
            self._begun()
        return self.conn.execute(statement)

    def _insert_new(self, table: Any, key: str, row: dict[str, Any]) -> bool:
        # RETURNING, not rowcount: drivers need not report an INSERT's row count (psycopg's
        # does not reach SQLAlchemy), and a conflict returns no row on both dialects.
        statement = (
            self._insert(table)
            .values(**row)
            .on_conflict_do_nothing(index_elements=[key])
            .returning(table.c[key])
        )
        return self._core(statement).first() is not None

    # effects
    def effect(self, effect_key: str) -> EffectRecord | None:
        row = self._run(self.sql.effect, (effect_key,)).fetchone()
        return None if row is None else codec.effect_from_row(dict(zip(EFFECT_COLUMNS, row)))

    def insert_effect(self, record: EffectRecord) -> bool:
        values = effect_values(codec.effect_to_row(record))
        # exec_driver_sql hands back the driver's own cursor row count, which sqlite3 and
        # psycopg both report for an INSERT (0 when the key exists); it costs far less to read
        # than a RETURNING row (see _insert_new for statements SQLAlchemy builds).
        return self._run(self.sql.insert_effect, values).rowcount == 1

    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        values = effect_values(codec.effect_to_row(record))[1:] + (
            expected.effect_key,
            expected.state.value,
            expected.action_id,
            expected.attempt,
        )
        return self._run(self.sql.update_effect, values).rowcount == 1

    def finish_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        values = self._finish_values(expected, record)
        return self._run(self.sql.finish_effect, values).rowcount == 1

    @staticmethod
    def _finish_values(expected: EffectRecord, record: EffectRecord) -> tuple[Any, ...]:
        row = codec.effect_to_row(record)
        return (
            row["state"],
            row["updated_at"],
            row["lease_expires_at"],
            row["result_json"],
            row["error"],
            expected.effect_key,
            expected.action_id,
            expected.state.value,
        )

    def list_effects(self, state: EffectState | None) -> list[EffectRecord]:
        query = select(effects).order_by(effects.c.created_at, effects.c.effect_key)
        if state is not None:
            query = query.where(effects.c.state == state.value)
        return [codec.effect_from_row(r) for r in self._core(query).mappings()]

    # approvals
    def approval(self, approval_id: str) -> ApprovalRecord | None:
        row = (
            self._core(select(approvals).where(approvals.c.approval_id == approval_id))
            .mappings()
            .first()
        )
        return None if row is None else codec.approval_from_row(row)

    def insert_approval(self, record: ApprovalRecord) -> bool:
        return self._insert_new(approvals, "approval_id", codec.approval_to_row(record))

    def update_approval(self, expected: ApprovalRecord, record: ApprovalRecord) -> bool:
        row = codec.approval_to_row(record)
        del row["approval_id"]
        statement = (
            update(approvals)
            .where(
                approvals.c.approval_id == expected.approval_id,
                approvals.c.status == expected.status.value,
                approvals.c.approvers.is_not_distinct_from(
                    codec.approvers_text(expected.approvers)
                ),
            )
            .values(**row)
        )
        return self._core(statement).rowcount == 1

    def find_approvals(
        self,
        *,
        action_hash: str | None = None,
        status: ApprovalStatus | None = None,
        valid_at: datetime | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ApprovalRecord]:
        query = select(approvals)
        if action_hash is not None:
            query = query.where(
                or_(approvals.c.action_hash == action_hash, approvals.c.edited_action_hash == action_hash)
            )
        if status is not None:
            query = query.where(approvals.c.status == status.value)
        if valid_at is not None:
            query = query.where(approvals.c.expires_at >= codec.ts(valid_at))
        order = (approvals.c.created_at, approvals.c.approval_id)
        query = query.order_by(*(c.desc() for c in order) if newest_first else order)
        if limit is not None:
            query = query.limit(limit)
        return [codec.approval_from_row(r) for r in self._core(query).mappings()]

    # events
    def insert_events(self, batch: Sequence[Event]) -> tuple[Event, ...]:
        return self._insert_events(batch, advance_head=False)[0]

    def insert_events_and_advance_head(
        self, batch: Sequence[Event]
    ) -> tuple[tuple[Event, ...], tuple[int, str] | None]:
        if not self.sql.combines or not batch or len(batch) > EVENTS_PER_STATEMENT:
            return self.insert_events(batch), self.advance_head()
        return self._insert_events(batch, advance_head=True)

    def _insert_events(
        self, batch: Sequence[Event], *, advance_head: bool
    ) -> tuple[tuple[Event, ...], tuple[int, str] | None]:
        rows = [codec.event_to_row(event) for event in batch]
        if not self.returning and not advance_head:  # nobody needs the ids: no RETURNING
            for start in range(0, len(rows), EVENTS_PER_STATEMENT):
                chunk = rows[start : start + EVENTS_PER_STATEMENT]
                self._run(self.sql.insert_events_plain(len(chunk)), _flat_events(chunk))
            return (), None
        ids: list[int] = []
        head = None
        for start in range(0, len(rows), EVENTS_PER_STATEMENT):
            chunk = rows[start : start + EVENTS_PER_STATEMENT]
            values = [v for row in chunk for v in event_values(row)]
            statement = self.sql.insert_events(len(chunk), advance_head=advance_head)
            returned = self._run(statement, tuple(values)).fetchall()
            if advance_head:
                moved = [r for r in returned if r[0] == 1]
                head = (int(moved[0][1]), moved[0][2]) if moved else None
                returned = [r[1:] for r in returned if r[0] == 0]
            ids += _match_ids(chunk, returned)
        stored = tuple(map(codec.stored_event, batch, rows, ids))
        return stored, head

    def reserve_new(
        self, record: EffectRecord, events: Sequence[Event], *, last: bool = False
    ) -> tuple[Event, ...] | None:
        if not self.sql.combines or not events or len(events) > EVENTS_PER_STATEMENT:
            return super().reserve_new(record, events)
        rows = [codec.event_to_row(event) for event in events]
        values = effect_values(codec.effect_to_row(record)) + _flat_events(rows)
        run = self._commits if last and self._commits else self._run
        returned = run(self.sql.reserve_new(len(rows)), values).fetchall()
        if not any(r[0] == 1 for r in returned):
            return None  # the key has a record: nothing was written
        if not self.returning:
            return ()
        ids = _match_ids(rows, [r[1:] for r in returned if r[0] == 0])
        return tuple(map(codec.stored_event, events, rows, ids))

    def finish_and_advance(
        self, expected: EffectRecord, record: EffectRecord, events: Sequence[Event]
    ) -> tuple[bool, tuple[Event, ...], tuple[int, str] | None]:
        if not self.sql.combines or not events or len(events) > EVENTS_PER_STATEMENT:
            return super().finish_and_advance(expected, record, events)
        rows = [codec.event_to_row(event) for event in events]
        values = self._finish_values(expected, record) + _flat_events(rows)
        returned = self._run(self.sql.finish_and_advance(len(rows)), values).fetchall()
        moved = [r for r in returned if r[0] == 1]
        head = (int(moved[0][1]), moved[0][2]) if moved else None
        finished = any(r[0] == 2 for r in returned)
        if not self.returning:
            return finished, (), head
        ids = _match_ids(rows, [r[1:] for r in returned if r[0] == 0])
        return finished, tuple(map(codec.stored_event, events, rows, ids)), head

    def list_events(self) -> list[Event]:
        query = select(events).order_by(events.c.event_id)
        return [codec.event_from_row(r) for r in self._core(query).mappings()]

    # receipts and the chain head
    def advance_head(self) -> tuple[int, str] | None:
        rows = self._run(self.sql.advance_head).fetchall()
        row = rows[0] if rows else None
        return None if row is None else (int(row[0]), row[1])

    def place_receipt(
        self, receipt: Receipt, document: dict[str, Any], *, last: bool = False
    ) -> bool:
        values = receipt_values(codec.receipt_to_row(receipt, document))
        if last and self._commits and self.sql.place_receipt_strict is not None:
            try:
                return self._commits(self.sql.place_receipt_strict, values).rowcount == 1
            except self._unique_error as exc:
                if _constraint(exc) == "receipts_pkey":
                    return False  # the id is taken: the transaction failed, nothing is kept
                raise
        if self.sql.place_receipt is not None:
            return self._run(self.sql.place_receipt, values).rowcount == 1
        if self._run(self.sql.insert_receipt, values).rowcount != 1:  # see insert_effect
            return False
        self._run(self.sql.set_head_hash, (receipt.hash,))
        return True

    def list_receipts(self) -> list[Receipt | UnreadableReceipt]:
        query = select(receipts).order_by(receipts.c.seq.asc().nulls_first(), receipts.c.receipt_id)
        return [codec.receipt_from_row(r) for r in self._core(query).mappings()]

    def head(self) -> tuple[int, str] | None:
        query = select(receipt_chain.c.seq, receipt_chain.c.hash).where(receipt_chain.c.id == 1)
        row = self._core(query).first()
        return None if row is None else (int(row[0]), row[1])


def _constraint(exc: BaseException) -> str | None:
    """The constraint a driver's integrity error names, when it says (psycopg does)."""
    return getattr(getattr(exc, "diag", None), "constraint_name", None)


def _flat_events(rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    return tuple(v for row in rows for v in event_values(row))


def _match_ids(rows: list[dict[str, Any]], returned: Sequence[Any]) -> list[int]:
    """The id the database gave each row, by content: the order of RETURNING rows is not
    guaranteed (SQLite says so). Rows equal in every column are interchangeable; they take
    their ids in ascending order."""
    if len(returned) != len(rows):
        raise CTRLRunError(f"the store returned {len(returned)} ids for {len(rows)} events")
    by_content: dict[tuple[Any, ...], list[int]] = {}
    for found in sorted(returned, key=lambda r: int(r[0]), reverse=True):
        by_content.setdefault(tuple(found[1:]), []).append(int(found[0]))
    try:
        return [by_content[event_values(row)].pop() for row in rows]
    except (KeyError, IndexError):
        raise CTRLRunError("the store returned event rows that differ from those written") from None
