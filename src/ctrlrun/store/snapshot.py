"""The chain check's read of a store: the head first, then the receipts after it streamed in
``seq`` order, all in one read snapshot, so a concurrent writer never shows up as a break.

SQLite: one read transaction (in WAL mode it does not block writers). Postgres: a ``REPEATABLE
READ`` transaction on a connection of its own and a server-side cursor. Memory: the store's
lock held for the walk (writers wait). Every row of the snapshot is walked; a row past the head
it read can only be an edit, and shows as ``head_mismatch``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..chain import ChainReport, ChainWalk, _position, verify_rows
from .verifymark import MARK_SELECT, MEMORY_ATTRIBUTE, VerifiedMark, mark_of

__all__ = ["walk_store"]

_READER_IDLE = "10min"  # how long a whole stream waits for its reader between batches
_BATCH = 500  # rows per fetch (a Postgres cursor fetches as many at a time)


class _Snapshot:
    """What one snapshot gives the walk (each store kind fills it in its own way)."""

    head: tuple[int, str] | None
    mark: VerifiedMark | None
    unchained: int

    def row_at(self, seq: int) -> tuple[Any, Any, Any] | None:  # pragma: no cover - per kind
        """``(receipt_id, json, hash)`` of the receipt at ``seq``."""
        raise NotImplementedError

    def rows_after(self, seq: int) -> Iterable[tuple[Any, Any, Any, Any]]:  # pragma: no cover
        """``(seq, receipt_id, json, hash)`` of every receipt after ``seq``, in ``seq`` order."""
        raise NotImplementedError


def _walk(snapshot: _Snapshot, since_verified: bool) -> ChainReport:
    walk = ChainWalk()
    walk.add_unchained(snapshot.unchained)
    mark = snapshot.mark if since_verified else None
    if mark is None or mark.seq < 1:  # no mark (or one before any receipt): the full check
        start, check, first = 0, "full", 1
    else:
        walk.start_at_mark((mark.seq, mark.hash), snapshot.row_at(mark.seq))
        start, check, first = mark.seq, "incremental", mark.seq
    add = walk.add_stored
    for seq, receipt_id, text, stored in snapshot.rows_after(start):
        add(seq, receipt_id, text, stored)
    return walk.report(snapshot.head, check=check, from_seq=first)


# ---------------------------------------------------------------- SQLite: one read transaction


class _SQLiteSnapshot(_Snapshot):
    def __init__(self, dbapi: Any, since_verified: bool) -> None:
        self._db = dbapi
        row = dbapi.execute("SELECT seq, hash FROM receipt_chain WHERE id = 1").fetchone()
        self.head = None if row is None else (int(row[0]), str(row[1]))
        self.mark = mark_of(dbapi.execute(MARK_SELECT).fetchone()) if since_verified else None
        self.unchained = int(dbapi.execute("SELECT count(*) FROM receipts WHERE seq IS NULL").fetchone()[0])

    def row_at(self, seq: int) -> tuple[Any, Any, Any] | None:
        row = self._db.execute("SELECT receipt_id, json, hash FROM receipts WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else tuple(row)

    def rows_after(self, seq: int) -> Iterator[tuple[Any, Any, Any, Any]]:
        cursor = self._db.execute(
            "SELECT seq, receipt_id, json, hash FROM receipts WHERE seq > ? ORDER BY seq", (seq,)
        )
        cursor.arraysize = _BATCH
        while batch := cursor.fetchmany():
            yield from batch


def _walk_sqlite(sqlite: Any, since_verified: bool) -> ChainReport:
    from sqlalchemy.exc import SQLAlchemyError

    errors = (SQLAlchemyError, sqlite._dbapi_error)
    try:
        raw = sqlite.engine.raw_connection()
    except errors as exc:
        raise sqlite._driver_error(exc, "connecting") from None
    try:
        dbapi = raw.driver_connection
        dbapi.execute("BEGIN")  # deferred: the first read below takes the snapshot
        try:
            return _walk(_SQLiteSnapshot(dbapi, since_verified), since_verified)
        finally:
            dbapi.execute("ROLLBACK")
    except errors as exc:
        raise sqlite._driver_error(exc, "reading") from None
    finally:
        raw.close()


# ---------------------------------------------------------------- Postgres: REPEATABLE READ


class _PostgresSnapshot(_Snapshot):
    def __init__(self, conn: Any, since_verified: bool) -> None:
        from sqlalchemy import func, select

        from .schema import receipt_chain, receipts, verified_mark

        self._conn, self._receipts = conn, receipts.c
        c, m, r = receipt_chain.c, verified_mark.c, receipts.c
        row = conn.execute(select(c.seq, c.hash).where(c.id == 1)).first()  # the snapshot starts here
        self.head = None if row is None else (int(row[0]), str(row[1]))
        self.mark = None
        if since_verified:
            self.mark = mark_of(conn.execute(select(m.seq, m.hash, m.verified_at).where(m.id == 1)).first())
        self.unchained = int(conn.execute(select(func.count()).where(r.seq.is_(None))).scalar_one())

    def row_at(self, seq: int) -> tuple[Any, Any, Any] | None:
        from sqlalchemy import select

        r = self._receipts
        row = self._conn.execute(select(r.receipt_id, r.json, r.hash).where(r.seq == seq)).first()
        return None if row is None else tuple(row)

    def rows_after(self, seq: int) -> Iterator[tuple[Any, Any, Any, Any]]:
        from sqlalchemy import select

        r = self._receipts
        query = select(r.seq, r.receipt_id, r.json, r.hash).where(r.seq > seq).order_by(r.seq)
        result = self._conn.execution_options(stream_results=True, yield_per=_BATCH).execute(query)
        for partition in result.partitions():
            yield from partition


def _walk_postgres(postgres: Any, since_verified: bool) -> ChainReport:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with postgres.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                return _walk(_PostgresSnapshot(conn, since_verified), since_verified)
    except SQLAlchemyError as exc:
        postgres._lost(exc)
        raise postgres._driver_error(exc, "reading") from None


def stream_receipts(postgres: Any, after_seq: int) -> Iterator[Any]:
    """Every receipt with ``seq > after_seq`` in seq order through a server-side cursor, on a
    connection of its own in one read-only ``REPEATABLE READ`` transaction: rows arrive a batch
    at a time and nothing of the table is buffered on the client."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from .codec import receipt_from_row
    from .schema import receipts

    r = receipts.c
    query = select(*r).where(r.seq > after_seq).order_by(r.seq)
    try:
        with postgres.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                # the reader may be slow (a pager): wait for it longer than the store's own bound
                conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{_READER_IDLE}'")
                result = conn.execution_options(stream_results=True, yield_per=_BATCH).execute(query)
                for partition in result.mappings().partitions():
                    for row in partition:
                        yield receipt_from_row(row)
    except SQLAlchemyError as exc:
        postgres._lost(exc)
        raise postgres._driver_error(exc, "reading") from None


# ---------------------------------------------------------------- memory: under its lock


class _MemorySnapshot(_Snapshot):
    """The postgres's rows as they stand (the caller holds its lock): nothing is copied."""

    def __init__(self, postgres: Any, since_verified: bool) -> None:
        data = postgres._data
        self._rows = data.receipts
        self.head = data.head
        self.mark = getattr(postgres, MEMORY_ATTRIBUTE, None) if since_verified else None
        self.unchained = sum(1 for row in self._rows.values() if row["seq"] is None)

    def row_at(self, seq: int) -> tuple[Any, Any, Any] | None:
        for row in self._rows.values():
            if row["seq"] == seq:
                return row["receipt_id"], row["json"], row["hash"]
        return None

    def rows_after(self, seq: int) -> Iterator[tuple[Any, Any, Any, Any]]:
        for row in self._rows.values():  # in the order written, which is seq order
            position = row["seq"]
            if position is not None and position > seq:
                yield position, row["receipt_id"], row["json"], row["hash"]


def _walk_memory(memory: Any, since_verified: bool) -> ChainReport:
    with memory._lock:
        return _walk(_MemorySnapshot(memory, since_verified), since_verified)


def walk_store(store: Any, *, since_verified: bool = False) -> ChainReport:
    """The chain check of ``store`` in one read snapshot (``verify_chain``'s store path).

    A store of another kind (any ``StateStore``) is read as its protocol allows: the head
    first, then ``receipts()``, whose rows past that head are left out (they came after it);
    it has no verified mark, so ``since_verified`` walks it all.
    """
    from .memory import InMemoryStateStore
    from .sql import SQLStateStore

    if isinstance(store, InMemoryStateStore):
        return _walk_memory(store, since_verified)
    if isinstance(store, SQLStateStore):
        sql = store  # its engine is the SQL store's own, not the protocol's
        if sql.engine.dialect.name == "sqlite":
            return _walk_sqlite(sql, since_verified)
        return _walk_postgres(sql, since_verified)
    head = store.chain_head()
    limit = None if head is None else head[0]
    rows = store.receipts()
    if limit is not None:
        rows = (r for r in rows if (_position(r) or 0) <= limit)
    return verify_rows(rows, head)
