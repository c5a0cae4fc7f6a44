"""The hot path's SQL, written once per dialect and schema (no statement is built per call)."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..errors import CTRLRunError
from .schema import effects, events, receipts

__all__ = [
    "EFFECT_COLUMNS",
    "EVENTS_PER_STATEMENT",
    "EVENT_COLUMNS",
    "RECEIPT_COLUMNS",
    "Statements",
    "effect_values",
    "event_values",
    "receipt_values",
]


def _dialect_insert(dialect: str) -> Callable[..., Any]:
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # pragma: no cover - only the two dialects exist
        raise CTRLRunError(f"no ctrlrun store for the {dialect} dialect")
    return insert


EFFECT_COLUMNS = tuple(c.name for c in effects.c)
EVENT_COLUMNS = tuple(c.name for c in events.c if c.name != "event_id")
RECEIPT_COLUMNS = tuple(c.name for c in receipts.c)
effect_values = itemgetter(*EFFECT_COLUMNS)
event_values = itemgetter(*EVENT_COLUMNS)
receipt_values = itemgetter(*RECEIPT_COLUMNS)
EVENTS_PER_STATEMENT = 500  # 6 parameters a row: far below SQLite's and Postgres' limits


class Statements:
    """The hot path's SQL for one dialect and schema, written once (``?`` is a parameter)."""

    def __init__(self, dialect: Any, schema: str | None) -> None:
        if dialect.name not in ("sqlite", "postgresql"):  # pragma: no cover
            raise CTRLRunError(f"no ctrlrun store for the {dialect.name} dialect")
        self.insert = _dialect_insert(dialect.name)
        prefix = dialect.identifier_preparer.quote_schema(schema) + "." if schema else ""
        # psycopg takes %s; SQLite's driver takes ?. No statement below holds % or a literal ?.
        self._mark = "%s" if dialect.paramstyle in ("format", "pyformat") else "?"

        def sql(text: str) -> str:
            assert "%" not in text
            return text.replace("{p}", prefix).replace("?", self._mark)

        effect_list = ", ".join(EFFECT_COLUMNS)
        self.effect = sql(f"SELECT {effect_list} FROM {{p}}effects WHERE effect_key = ?")
        self.insert_effect = sql(
            f"INSERT INTO {{p}}effects ({effect_list}) VALUES ({_marks(len(EFFECT_COLUMNS))}) "
            "ON CONFLICT (effect_key) DO NOTHING"
        )
        self.update_effect = sql(
            "UPDATE {p}effects SET "
            + ", ".join(f"{c} = ?" for c in EFFECT_COLUMNS[1:])
            + " WHERE effect_key = ? AND state = ? AND action_id = ? AND attempt = ?"
        )
        finish_effect = (
            "UPDATE {p}effects SET state = ?, updated_at = ?, lease_expires_at = ?, "
            "result_json = ?, error = ? WHERE effect_key = ? AND action_id = ? AND state = ? "
            "AND result_json IS NULL AND error IS NULL"
        )
        self.finish_effect = sql(finish_effect)
        self._finish_effect = finish_effect
        self._insert_effect = (
            f"INSERT INTO {{p}}effects ({effect_list}) VALUES ({_marks(len(EFFECT_COLUMNS))}) "
            "ON CONFLICT (effect_key) DO NOTHING"
        )
        self._insert_events = (
            f"INSERT INTO {{p}}events ({', '.join(EVENT_COLUMNS)}) VALUES ",
            f"({_marks(len(EVENT_COLUMNS))})",
            f" RETURNING event_id, {', '.join(EVENT_COLUMNS)}",
        )
        self._events_sql: dict[tuple[Any, ...], str] = {}
        self.advance_head = sql(
            "UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash"
        )
        insert_receipt = (
            f"INSERT INTO {{p}}receipts ({', '.join(RECEIPT_COLUMNS)}) "
            f"VALUES ({_marks(len(RECEIPT_COLUMNS))}) ON CONFLICT (receipt_id) DO NOTHING"
        )
        self.insert_receipt = sql(insert_receipt)
        self.set_head_hash = sql("UPDATE {p}receipt_chain SET hash = ? WHERE id = 1")
        # Postgres runs two writes in one statement (a data-modifying CTE), one round trip
        # less each time; SQLite has no such CTE and sends the statements one by one.
        self.combines = dialect.name == "postgresql"
        # the head takes the hash only of a receipt row inserted
        place = (
            "WITH placed AS ({insert} RETURNING hash) "
            "UPDATE {{p}}receipt_chain AS head SET hash = placed.hash FROM placed "
            "WHERE head.id = 1"
        )
        self.place_receipt = (
            sql(place.format(insert=insert_receipt)) if self.combines else None
        )
        # committed with the statement: a taken id must fail it (a unique violation), since
        # an insert that did nothing would commit the rest of the transaction
        strict_insert = insert_receipt.replace(" ON CONFLICT (receipt_id) DO NOTHING", "")
        self.place_receipt_strict = (
            sql(place.format(insert=strict_insert)) if self.combines else None
        )
        self._sql = sql

    def insert_events(self, rows: int, *, advance_head: bool = False) -> str:
        """``INSERT`` of ``rows`` events in one statement, returning each row with its id.

        ``advance_head`` (Postgres only): the same statement also moves the chain head, in a
        data-modifying CTE, and returns it as one more row flagged ``1`` in a first column
        (event rows carry ``0``).
        """
        def build() -> str:
            head, row, tail = self._insert_events
            insert = head + ", ".join([row] * rows) + tail
            if not advance_head:
                return insert
            assert self.combines
            columns = ", ".join(EVENT_COLUMNS)
            nulls = ", ".join(["NULL"] * (len(EVENT_COLUMNS) - 1))
            return (
                f"WITH added AS ({insert}), "
                "moved AS (UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 "
                "RETURNING seq, hash) "
                f"SELECT 0, event_id, {columns} FROM added "
                f"UNION ALL SELECT 1, seq, hash, {nulls} FROM moved"
            )

        return self._cached(("returning", advance_head), rows, build)

    def insert_events_plain(self, rows: int) -> str:
        """``INSERT`` of ``rows`` events in one statement, returning nothing."""
        head, row, _ = self._insert_events
        return self._cached(("plain",), rows, lambda: head + ", ".join([row] * rows))

    def reserve_new(self, rows: int) -> str:
        """Postgres: the effect inserted and, only if it was, ``rows`` events, in one statement.

        Returns a row ``(1, NULL…)`` when the effect was inserted and ``(0, event_id, columns…)``
        per event.
        """
        return self._cached(("reserve",), rows, lambda: self._combined("reserve", rows))

    def finish_and_advance(self, rows: int) -> str:
        """Postgres: the outcome's compare-and-set, ``rows`` events and the chain head moved, in
        one statement. Returns ``(0, event_id, columns…)`` per event, ``(1, seq, hash, NULL…)``
        for the head and ``(2, NULL…)`` when the compare-and-set matched."""
        return self._cached(("finish",), rows, lambda: self._combined("finish", rows))

    def _combined(self, kind: str, rows: int) -> str:
        assert self.combines
        columns = ", ".join(EVENT_COLUMNS)
        nulls = ", ".join(["NULL"] * (len(EVENT_COLUMNS) - 1))
        values = ", ".join([f"({_marks(len(EVENT_COLUMNS))})"] * rows)
        returning = f"RETURNING event_id, {columns}"
        if kind == "reserve":
            return (
                f"WITH reserved AS ({self._insert_effect} RETURNING 1), "
                f"added AS (INSERT INTO {{p}}events ({columns}) SELECT * FROM (VALUES {values}) "
                f"AS v ({columns}) WHERE EXISTS (SELECT 1 FROM reserved) {returning}) "
                f"SELECT 0, event_id, {columns} FROM added "
                f"UNION ALL SELECT 1, NULL, NULL, {nulls} FROM reserved"
            )
        return (
            f"WITH finished AS ({self._finish_effect} RETURNING 1), "
            f"added AS (INSERT INTO {{p}}events ({columns}) VALUES {values} {returning}), "
            "moved AS (UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 "
            "RETURNING seq, hash) "
            f"SELECT 0, event_id, {columns} FROM added "
            f"UNION ALL SELECT 1, seq, hash, {nulls} FROM moved "
            f"UNION ALL SELECT 2, NULL, NULL, {nulls} FROM finished"
        )

    def _cached(self, kind: tuple[Any, ...], rows: int, build: Callable[[], str]) -> str:
        """The statement of ``kind`` for ``rows`` events: built once (with ``?`` turned into the
        driver's mark), kept for the small batches a call sends."""
        key = (*kind, rows)
        statement = self._events_sql.get(key)
        if statement is None:
            statement = self._sql(build())
            if rows <= 16:
                self._events_sql[key] = statement
        return statement


def _marks(n: int) -> str:
    return ", ".join(["?"] * n)
