"""The chain check's read of a store: the head first, then the receipts after it streamed in
``seq`` order, all in one read snapshot, so a concurrent writer never shows up as a break.

SQLite: one read transaction (in WAL mode it does not block writers). Postgres: a ``REPEATABLE
READ`` transaction on a connection of its own and a server-side cursor. Memory: the store's
lock held for the walk (writers wait). Every row of the snapshot is walked; a row past the head
it read can only be an edit, and shows as ``head_mismatch``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .marks import MARK_SELECT, MEMORY_ATTRIBUTE, VerifiedMark, mark_of

__all__ = ["Snapshot", "open_snapshot", "stream_receipts"]

_READER_IDLE = "10min"  # how long a whole stream waits for its reader between batches
_BATCH = 500  # rows per fetch (a Postgres cursor fetches as many at a time)


class Snapshot:
    """What one snapshot gives the chain walk: the head, the mark and the count of unchained
    rows read first, then rows by ``seq`` (each store kind fills it in its own way)."""

    head: tuple[int, str] | None
    mark: VerifiedMark | None
    unchained: int
    checkpoint: tuple[int, str] | None = None  # where a prune left the chain

    def row_at(self, seq: int) -> tuple[Any, Any, Any] | None:  # pragma: no cover - per kind
        """``(receipt_id, json, hash)`` of the receipt at ``seq``."""
        raise NotImplementedError

    def rows_after(self, seq: int) -> Iterable[tuple[Any, Any, Any, Any]]:  # pragma: no cover
        """``(seq, receipt_id, json, hash)`` of every receipt after ``seq``, in ``seq`` order."""
        raise NotImplementedError


# ---------------------------------------------------------------- SQLite: one read transaction


class _SQLiteSnapshot(Snapshot):
    def __init__(self, dbapi: Any, since_verified: bool) -> None:
        self._db = dbapi
        row = dbapi.execute("SELECT seq, hash FROM receipt_chain WHERE id = 1").fetchone()
        self.head = None if row is None else (int(row[0]), str(row[1]))
        self.mark = mark_of(dbapi.execute(MARK_SELECT).fetchone()) if since_verified else None
        self.unchained = int(dbapi.execute("SELECT count(*) FROM receipts WHERE seq IS NULL").fetchone()[0])
        row = dbapi.execute("SELECT seq, hash FROM prune_checkpoint WHERE id = 1").fetchone()
        self.checkpoint = None if row is None else (int(row[0]), str(row[1]))

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


@contextmanager
def _sqlite_snapshot(sqlite: Any, since_verified: bool) -> Iterator[Snapshot]:
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
            yield _SQLiteSnapshot(dbapi, since_verified)
        finally:
            dbapi.execute("ROLLBACK")
    except errors as exc:
        raise sqlite._driver_error(exc, "reading") from None
    finally:
        raw.close()


# ---------------------------------------------------------------- Postgres: REPEATABLE READ


class _PostgresSnapshot(Snapshot):
    def __init__(self, conn: Any, since_verified: bool) -> None:
        from sqlalchemy import func, select

        from .schema import prune_checkpoint, receipt_chain, receipts, verified_mark

        self._conn, self._receipts = conn, receipts.c
        c, m, r = receipt_chain.c, verified_mark.c, receipts.c
        row = conn.execute(select(c.seq, c.hash).where(c.id == 1)).first()  # the snapshot starts here
        self.head = None if row is None else (int(row[0]), str(row[1]))
        self.mark = None
        if since_verified:
            self.mark = mark_of(conn.execute(
                select(m.seq, m.hash, m.verified_at, m.acts_seq, m.acts_hash).where(m.id == 1)
            ).first())  # fmt: skip
        self.unchained = int(conn.execute(select(func.count()).where(r.seq.is_(None))).scalar_one())
        p = prune_checkpoint.c
        row = conn.execute(select(p.seq, p.hash).where(p.id == 1)).first()
        self.checkpoint = None if row is None else (int(row[0]), str(row[1]))

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


@contextmanager
def _postgres_read(postgres: Any) -> Iterator[Any]:
    """A connection of its own in one read-only ``REPEATABLE READ`` transaction."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with postgres.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                yield conn
    except SQLAlchemyError as exc:
        postgres._lost(exc)
        raise postgres._driver_error(exc, "reading") from None


@contextmanager
def _postgres_snapshot(postgres: Any, since_verified: bool) -> Iterator[Snapshot]:
    with _postgres_read(postgres) as conn:
        yield _PostgresSnapshot(conn, since_verified)


def stream_receipts(postgres: Any, after_seq: int) -> Iterator[Any]:
    """Every receipt with ``seq > after_seq`` in seq order through a server-side cursor, on a
    connection of its own in one read-only ``REPEATABLE READ`` transaction: rows arrive a batch
    at a time and nothing of the table is buffered on the client."""
    from sqlalchemy import select

    from .codec import receipt_from_row
    from .schema import receipts

    r = receipts.c
    query = select(*r).where(r.seq > after_seq).order_by(r.seq)
    with _postgres_read(postgres) as conn:
        # the reader may be slow (a pager): wait for it longer than the store's own bound
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{_READER_IDLE}'")
        result = conn.execution_options(stream_results=True, yield_per=_BATCH).execute(query)
        for partition in result.mappings().partitions():
            for row in partition:
                yield receipt_from_row(row)


# ---------------------------------------------------------------- memory: under its lock


class _MemorySnapshot(Snapshot):
    """The memory store's rows as they stand (the caller holds its lock): nothing is copied."""

    def __init__(self, memory: Any, since_verified: bool) -> None:
        data = memory._data
        self._rows = data.receipts
        self.head = data.head
        self.mark = getattr(memory, MEMORY_ATTRIBUTE, None) if since_verified else None
        self.unchained = sum(1 for row in self._rows.values() if row["seq"] is None)
        found = data.evidence.checkpoint
        self.checkpoint = None if found is None else (found.seq, found.hash)

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


@contextmanager
def _memory_snapshot(memory: Any, since_verified: bool) -> Iterator[Snapshot]:
    with memory._lock:
        yield _MemorySnapshot(memory, since_verified)


@contextmanager
def open_snapshot(store: Any, *, since_verified: bool = False) -> Iterator[Snapshot | None]:
    """One read snapshot of a memory, SQLite or Postgres store; ``None`` for a store of another
    kind (any ``StateStore``), which the chain check reads through its protocol instead."""
    from .memory import InMemoryStateStore
    from .sql import SQLStateStore

    if isinstance(store, InMemoryStateStore):
        opened = _memory_snapshot(store, since_verified)
    elif isinstance(store, SQLStateStore):
        sql = store  # its engine is the SQL store's own, not the protocol's
        dialect = sql.engine.dialect.name
        opened = (_sqlite_snapshot if dialect == "sqlite" else _postgres_snapshot)(sql, since_verified)
    else:
        yield None
        return
    with opened as snapshot:
        yield snapshot
