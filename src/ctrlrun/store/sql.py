"""The SQL store shared by dialects: SQLAlchemy Core, compare-and-set, a connection per thread.

The statements of the hot path (an allowed call's *start* and *finish* transactions) are
written out once per store as plain SQL for its dialect. A write transaction sends them, with
its ``BEGIN`` and ``COMMIT``, straight to the driver's cursor on the SQLAlchemy connection, unless
something observes the engine (a statement, commit or rollback listener, or ``echo``): then they
go through SQLAlchemy (``exec_driver_sql``) so every observer sees them. Either way the driver's
errors read the same and a lost connection is invalidated. The rest (approvals, listings) stays
SQLAlchemy Core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from ..approvals import ApprovalRecord, ApprovalStatus
from ..effect import EffectRecord, EffectState
from ..errors import AmbiguousWrite, CTRLRunError
from ..receipt import Event, Receipt, UnreadableReceipt
from . import codec
from .ops import KeptWrite, StoreOps, Tx, TxSteps
from .schema import approvals, effects, events, receipt_chain, receipts

__all__ = ["DirectWrite", "SQLStateStore", "SQLTx", "Statements"]

T = TypeVar("T")


def _dialect_insert(dialect: str) -> Callable[..., Any]:
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # pragma: no cover - only the two dialects exist
        raise CTRLRunError(f"no ctrlrun store for the {dialect} dialect")
    return insert


_EFFECT_COLUMNS = tuple(c.name for c in effects.c)
_EVENT_COLUMNS = tuple(c.name for c in events.c if c.name != "event_id")
_RECEIPT_COLUMNS = tuple(c.name for c in receipts.c)
_effect_values = itemgetter(*_EFFECT_COLUMNS)
_event_values = itemgetter(*_EVENT_COLUMNS)
_receipt_values = itemgetter(*_RECEIPT_COLUMNS)
_EVENTS_PER_STATEMENT = 500  # 6 parameters a row: far below SQLite's and Postgres' limits


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

        effect_list = ", ".join(_EFFECT_COLUMNS)
        self.effect = sql(f"SELECT {effect_list} FROM {{p}}effects WHERE effect_key = ?")
        self.insert_effect = sql(
            f"INSERT INTO {{p}}effects ({effect_list}) VALUES ({_marks(len(_EFFECT_COLUMNS))}) "
            "ON CONFLICT (effect_key) DO NOTHING"
        )
        self.update_effect = sql(
            "UPDATE {p}effects SET "
            + ", ".join(f"{c} = ?" for c in _EFFECT_COLUMNS[1:])
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
            f"INSERT INTO {{p}}effects ({effect_list}) VALUES ({_marks(len(_EFFECT_COLUMNS))}) "
            "ON CONFLICT (effect_key) DO NOTHING"
        )
        self._insert_events = (
            f"INSERT INTO {{p}}events ({', '.join(_EVENT_COLUMNS)}) VALUES ",
            f"({_marks(len(_EVENT_COLUMNS))})",
            f" RETURNING event_id, {', '.join(_EVENT_COLUMNS)}",
        )
        self._events_sql: dict[tuple[Any, ...], str] = {}
        self.advance_head = sql(
            "UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash"
        )
        insert_receipt = (
            f"INSERT INTO {{p}}receipts ({', '.join(_RECEIPT_COLUMNS)}) "
            f"VALUES ({_marks(len(_RECEIPT_COLUMNS))}) ON CONFLICT (receipt_id) DO NOTHING"
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
        key = (rows, advance_head)
        statement = self._events_sql.get(key)
        if statement is None:
            head, row, tail = self._insert_events
            insert = head + ", ".join([row] * rows) + tail
            if advance_head:
                assert self.combines
                columns = ", ".join(_EVENT_COLUMNS)
                nulls = ", ".join(["NULL"] * (len(_EVENT_COLUMNS) - 1))
                insert = (
                    f"WITH added AS ({insert}), "
                    "moved AS (UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 "
                    "RETURNING seq, hash) "
                    f"SELECT 0, event_id, {columns} FROM added "
                    f"UNION ALL SELECT 1, seq, hash, {nulls} FROM moved"
                )
            statement = self._sql(insert)
            if rows <= 16:
                self._events_sql[key] = statement
        return statement


    def insert_events_plain(self, rows: int) -> str:
        """``INSERT`` of ``rows`` events in one statement, returning nothing."""
        key = ("plain", rows)
        statement = self._events_sql.get(key)
        if statement is None:
            head, row, _ = self._insert_events
            statement = self._sql(head + ", ".join([row] * rows))
            if rows <= 16:
                self._events_sql[key] = statement
        return statement

    def reserve_new(self, rows: int) -> str:
        """Postgres: the effect inserted and, only if it was, ``rows`` events, in one statement.

        Returns a row ``(1, NULL…)`` when the effect was inserted and ``(0, event_id, columns…)``
        per event.
        """
        return self._combined(("reserve", rows))

    def finish_and_advance(self, rows: int) -> str:
        """Postgres: the outcome's compare-and-set, ``rows`` events and the chain head moved, in
        one statement. Returns ``(0, event_id, columns…)`` per event, ``(1, seq, hash, NULL…)``
        for the head and ``(2, NULL…)`` when the compare-and-set matched."""
        return self._combined(("finish", rows))

    def _combined(self, key: tuple[str, int]) -> str:
        statement = self._events_sql.get(key)
        if statement is not None:
            return statement
        assert self.combines
        kind, rows = key
        columns = ", ".join(_EVENT_COLUMNS)
        nulls = ", ".join(["NULL"] * (len(_EVENT_COLUMNS) - 1))
        values = ", ".join([f"({_marks(len(_EVENT_COLUMNS))})"] * rows)
        returning = f"RETURNING event_id, {columns}"
        if kind == "reserve":
            text = (
                f"WITH reserved AS ({self._insert_effect} RETURNING 1), "
                f"added AS (INSERT INTO {{p}}events ({columns}) SELECT * FROM (VALUES {values}) "
                f"AS v ({columns}) WHERE EXISTS (SELECT 1 FROM reserved) {returning}) "
                f"SELECT 0, event_id, {columns} FROM added "
                f"UNION ALL SELECT 1, NULL, NULL, {nulls} FROM reserved"
            )
        else:
            text = (
                f"WITH finished AS ({self._finish_effect} RETURNING 1), "
                f"added AS (INSERT INTO {{p}}events ({columns}) VALUES {values} {returning}), "
                "moved AS (UPDATE {p}receipt_chain SET seq = seq + 1 WHERE id = 1 "
                "RETURNING seq, hash) "
                f"SELECT 0, event_id, {columns} FROM added "
                f"UNION ALL SELECT 1, seq, hash, {nulls} FROM moved "
                f"UNION ALL SELECT 2, NULL, NULL, {nulls} FROM finished"
            )
        statement = self._sql(text)
        if rows <= 16:
            self._events_sql[key] = statement
        return statement


def _marks(n: int) -> str:
    return ", ".join(["?"] * n)


def _schema_of(engine: Engine) -> str | None:
    """The schema the engine's ``schema_translate_map`` puts unqualified tables in, if any."""
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    return translate.get(None)


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
        return None if row is None else codec.effect_from_row(dict(zip(_EFFECT_COLUMNS, row)))

    def insert_effect(self, record: EffectRecord) -> bool:
        values = _effect_values(codec.effect_to_row(record))
        # exec_driver_sql hands back the driver's own cursor row count, which sqlite3 and
        # psycopg both report for an INSERT (0 when the key exists); it costs far less to read
        # than a RETURNING row (see _insert_new for statements SQLAlchemy builds).
        return self._run(self.sql.insert_effect, values).rowcount == 1

    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        values = _effect_values(codec.effect_to_row(record))[1:] + (
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
        if not self.sql.combines or not batch or len(batch) > _EVENTS_PER_STATEMENT:
            return self.insert_events(batch), self.advance_head()
        return self._insert_events(batch, advance_head=True)

    def _insert_events(
        self, batch: Sequence[Event], *, advance_head: bool
    ) -> tuple[tuple[Event, ...], tuple[int, str] | None]:
        rows = [codec.event_to_row(event) for event in batch]
        if not self.returning and not advance_head:  # nobody needs the ids: no RETURNING
            for start in range(0, len(rows), _EVENTS_PER_STATEMENT):
                chunk = rows[start : start + _EVENTS_PER_STATEMENT]
                self._run(self.sql.insert_events_plain(len(chunk)), _flat_events(chunk))
            return (), None
        ids: list[int] = []
        head = None
        for start in range(0, len(rows), _EVENTS_PER_STATEMENT):
            chunk = rows[start : start + _EVENTS_PER_STATEMENT]
            values = [v for row in chunk for v in _event_values(row)]
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
        if not self.sql.combines or not events or len(events) > _EVENTS_PER_STATEMENT:
            return super().reserve_new(record, events)
        rows = [codec.event_to_row(event) for event in events]
        values = _effect_values(codec.effect_to_row(record)) + _flat_events(rows)
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
        if not self.sql.combines or not events or len(events) > _EVENTS_PER_STATEMENT:
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
        values = _receipt_values(codec.receipt_to_row(receipt, document))
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
    return tuple(v for row in rows for v in _event_values(row))


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
        return [by_content[_event_values(row)].pop() for row in rows]
    except (KeyError, IndexError):
        raise CTRLRunError("the store returned event rows that differ from those written") from None


class DirectWrite:
    """A write transaction begun and ended on the driver connection, under SQLAlchemy's.

    ``run`` has ``exec_driver_sql``'s shape and answers with the cursor. With ``fused``, the
    cursor accepts several statements in one message (psycopg's client-side binding cursor):
    ``BEGIN`` is not sent alone but in front of the first statement, and ``run_and_commit``
    sends a statement with the ``COMMIT``, so a transaction costs two round trips fewer.
    ``committing`` is true while a message carrying ``COMMIT`` is unanswered: an error then
    leaves the outcome unknown unless the transaction failed before it.
    """

    def __init__(
        self, dbapi: Any, cursor: Any, begin: str, *, fused: bool = False,
        unique_error: type[BaseException] | tuple[()] = (),
    ) -> None:  # fmt: skip
        self.dbapi = dbapi
        self.cursor = cursor
        self.unique_error = unique_error
        self.committing = False
        self._begin = begin
        self._open = False  # a transaction is open on the server
        if fused:
            self.run_and_commit = self._run_and_commit
        else:
            cursor.execute(begin)
            self._open = True

    @property
    def is_active(self) -> bool:
        return self._open

    def begin_now(self) -> None:
        """Send a deferred ``BEGIN`` alone, before a statement that does not go through ``run``."""
        if not self._open:
            self.cursor.execute(self._begin)
            self._open = True

    def run(self, statement: str, parameters: Sequence[Any] | None = None) -> Any:
        cursor = self.cursor
        if not self._open:
            cursor.execute(f"{self._begin}; {statement}", parameters)
            self._open = True
            cursor.nextset()  # past BEGIN's result, to the statement's
        elif parameters is None:
            cursor.execute(statement)
        else:
            cursor.execute(statement, parameters)
        return cursor

    def _run_and_commit(self, statement: str, parameters: Sequence[Any] | None = None) -> Any:
        cursor = self.cursor
        begun = not self._open
        text = f"{self._begin}; {statement}; COMMIT" if begun else f"{statement}; COMMIT"
        self._open, self.committing = True, True
        cursor.execute(text, parameters)
        self._open, self.committing = False, False
        if begun:
            cursor.nextset()
        return cursor

    def commit(self) -> None:
        if self._open:
            self.dbapi.commit()
            self._open = False

    def rollback(self) -> None:
        self._open = False
        self.dbapi.rollback()


class SQLStateStore(StoreOps):
    """The store over a SQLAlchemy engine: each write one transaction, each thread one connection.

    A dialect subclass provides the engine, the statement that opens a write transaction
    (``BEGIN_WRITE``, emitted by ``_on_begin`` once the subclass listens for the engine's
    ``begin`` event), and how driver errors read (``_driver_error``, ``_commit_error``).
    """

    BEGIN_WRITE = "BEGIN"

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime]) -> None:
        super().__init__(clock=clock)
        self.engine = engine
        event.listen(engine, "begin", self._on_begin)
        self._statements = Statements(engine.dialect, _schema_of(engine))
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._errors: tuple[type[BaseException], ...] = (SQLAlchemyError, self._dbapi_error)
        self._local = threading.local()
        self._connections: list[Connection] = []
        self._connections_lock = threading.Lock()
        self._generation = 0

    # -- dialect hooks

    def _open(self, migrate: bool) -> None:  # pragma: no cover - every dialect provides it
        raise NotImplementedError

    def _open_or_close(self, migrate: bool) -> None:
        """Check (and, with ``migrate``, bring up to date) the schema; a refusal closes the store."""
        try:
            self._open(migrate)
        except BaseException:
            self.close()
            raise

    def _on_begin(self, conn: Connection) -> None:
        if conn.info.get("ctrlrun_write"):
            conn.exec_driver_sql(self.BEGIN_WRITE)

    def _begin_locked(self, conn: Connection) -> Any:
        """A SQLAlchemy transaction opened with ``BEGIN_WRITE`` (driver transactions are off)."""
        conn.info["ctrlrun_write"] = True
        try:
            return conn.begin()
        finally:
            conn.info["ctrlrun_write"] = False

    def _observed(self) -> bool:
        """Whether anything watches the engine's statements or transactions (or echoes them)."""
        d = self.engine.dispatch
        return bool(
            self.engine.echo
            or d.before_cursor_execute
            or d.after_cursor_execute
            or d.before_execute
            or d.after_execute
            or d.commit
            or d.rollback
        )

    def _begin_write(self, conn: Connection) -> Any:
        """Open the transaction of one write: on the driver itself, or through SQLAlchemy when
        the engine is observed. It has ``commit``, ``rollback`` and, when direct, ``run``."""
        if self._observed():
            return self._begin_locked(conn)
        return self._direct_write(conn.connection.driver_connection)

    def _failed_first(self, transaction: Any) -> bool:
        """Whether a transaction whose message carried ``COMMIT`` failed before it (so nothing
        was committed); a dialect that cannot tell answers False (the outcome is unknown)."""
        return False

    def _direct_write(self, dbapi: Any) -> DirectWrite:
        """A transaction on the driver connection, ``BEGIN_WRITE`` sent at once."""
        return DirectWrite(dbapi, dbapi.cursor(), self.BEGIN_WRITE)

    def _lost(self, conn: Connection, exc: BaseException) -> None:
        """Invalidate ``conn`` when a driver error says the connection is gone (SQLAlchemy does
        this itself for the errors it wraps)."""
        if isinstance(exc, self._dbapi_error) and not isinstance(exc, SQLAlchemyError):
            try:
                if self.engine.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None):
                    conn.invalidate(exc)
            except Exception:  # judging it is best effort; the next write reconnects anyway
                pass

    def _driver_error(self, exc: BaseException, doing: str) -> CTRLRunError:
        return CTRLRunError(f"the store failed while {doing}: {exc}")

    def _commit_error(self, exc: BaseException) -> CTRLRunError:
        return AmbiguousWrite(
            f"the store's COMMIT failed and its outcome is unknown ({exc}); "
            "nothing was run: check the effect before retrying"
        )

    # -- connections

    def _conn(self) -> Connection:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and conn.invalidated and not conn.closed:
            try:  # the driver lost it (a dropped connection): start over on a fresh one
                conn.close()
            except Exception:
                pass
        if conn is None or conn.closed or local.generation != self._generation:
            try:
                conn = self.engine.connect()
            except SQLAlchemyError as exc:
                raise self._driver_error(exc, "connecting") from None
            with self._connections_lock:
                self._connections.append(conn)
                local.conn, local.generation = conn, self._generation
        if conn.in_transaction():
            conn.rollback()
        return conn

    def close(self) -> None:
        """Close every thread's connection; a later call opens a fresh one."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
            self._generation += 1
        for conn in connections:
            try:
                conn.close()
            except Exception:  # closing is best effort
                pass
        self.engine.dispose()

    # -- transactions

    @staticmethod
    def _rollback(transaction: Any) -> None:
        try:
            transaction.rollback()
        except Exception:  # the connection may already be gone
            pass

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:
        conn = self._conn()
        self._count()
        errors = self._errors
        try:
            transaction = self._begin_write(conn)
        except errors as exc:
            self._lost(conn, exc)
            raise self._driver_error(exc, "starting a write") from None
        kept: CTRLRunError | None = None
        tx = SQLTx(conn, self._statements, transaction)
        try:
            result = operation(tx, self._now())
        except KeptWrite as exc:
            kept = exc.error
        except errors as exc:
            self._lost(conn, exc)
            unknown = getattr(transaction, "committing", False) and not self._failed_first(
                transaction
            )
            self._rollback(transaction)
            if unknown:  # the COMMIT sent with the statement may have been carried out
                raise self._commit_error(exc) from None
            raise self._driver_error(exc, "writing") from None
        except BaseException:
            self._rollback(transaction)
            raise
        try:
            transaction.commit()
        except (*errors, OSError) as exc:
            self._lost(conn, exc)
            self._rollback(transaction)
            raise self._commit_error(exc) from None
        if kept is not None:
            raise kept
        return result

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:
        conn = self._conn()
        try:
            return operation(SQLTx(conn, self._statements), self._now())
        except (SQLAlchemyError, UnicodeError) as exc:
            raise self._driver_error(exc, "reading") from None
        finally:
            try:
                conn.rollback()
            except Exception:
                pass
