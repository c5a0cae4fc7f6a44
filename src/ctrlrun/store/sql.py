"""The SQL store shared by dialects: SQLAlchemy Core, compare-and-set, a connection per thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, exists, select, update
from sqlalchemy.exc import SQLAlchemyError

from ..approvals import ApprovalRecord, ApprovalStatus
from ..effect import EffectRecord, EffectState
from ..errors import AmbiguousWrite, CTRLRunError
from ..receipt import Event, Receipt, UnreadableReceipt
from . import codec
from .ops import KeptWrite, StoreOps, Tx
from .schema import approvals, effects, events, receipt_chain, receipts

__all__ = ["SQLStateStore", "SQLTx"]

T = TypeVar("T")


def _dialect_insert(dialect: str) -> Callable[..., Any]:
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # pragma: no cover - only the two dialects exist
        raise CTRLRunError(f"no ctrlrun store for the {dialect} dialect")
    return insert


class SQLTx:
    """The row operations over one SQLAlchemy connection inside the caller's transaction."""

    def __init__(self, conn: Connection, insert: Callable[..., Any]) -> None:
        self.conn = conn
        self._insert = insert

    def _insert_new(self, table: Any, key: str, row: dict[str, Any]) -> bool:
        # RETURNING, not rowcount: drivers need not report an INSERT's row count (psycopg's
        # does not reach SQLAlchemy), and a conflict returns no row on both dialects.
        statement = (
            self._insert(table)
            .values(**row)
            .on_conflict_do_nothing(index_elements=[key])
            .returning(table.c[key])
        )
        return self.conn.execute(statement).first() is not None

    # effects
    def effect(self, effect_key: str) -> EffectRecord | None:
        row = (
            self.conn.execute(select(effects).where(effects.c.effect_key == effect_key))
            .mappings()
            .first()
        )
        return None if row is None else codec.effect_from_row(row)

    def insert_effect(self, record: EffectRecord) -> bool:
        return self._insert_new(effects, "effect_key", codec.effect_to_row(record))

    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        row = codec.effect_to_row(record)
        del row["effect_key"]
        statement = (
            update(effects)
            .where(
                effects.c.effect_key == expected.effect_key,
                effects.c.state == expected.state.value,
                effects.c.action_id == expected.action_id,
                effects.c.attempt == expected.attempt,
            )
            .values(**row)
        )
        return self.conn.execute(statement).rowcount == 1

    def list_effects(self, state: EffectState | None) -> list[EffectRecord]:
        query = select(effects).order_by(effects.c.created_at, effects.c.effect_key)
        if state is not None:
            query = query.where(effects.c.state == state.value)
        return [codec.effect_from_row(r) for r in self.conn.execute(query).mappings()]

    # approvals
    def approval(self, approval_id: str) -> ApprovalRecord | None:
        row = (
            self.conn.execute(select(approvals).where(approvals.c.approval_id == approval_id))
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
        return self.conn.execute(statement).rowcount == 1

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
            query = query.where(approvals.c.action_hash == action_hash)
        if status is not None:
            query = query.where(approvals.c.status == status.value)
        if valid_at is not None:
            query = query.where(approvals.c.expires_at >= codec.ts(valid_at))
        order = (approvals.c.created_at, approvals.c.approval_id)
        query = query.order_by(*(c.desc() for c in order) if newest_first else order)
        if limit is not None:
            query = query.limit(limit)
        return [codec.approval_from_row(r) for r in self.conn.execute(query).mappings()]

    # events
    def insert_event(self, event: Event) -> Event:
        row = codec.event_to_row(event)
        event_id = self.conn.execute(
            events.insert().values(**row).returning(events.c.event_id)
        ).scalar_one()
        return codec.event_from_row({**row, "event_id": event_id})

    def list_events(self) -> list[Event]:
        query = select(events).order_by(events.c.event_id)
        return [codec.event_from_row(r) for r in self.conn.execute(query).mappings()]

    # receipts and the chain head
    def has_receipt(self, receipt_id: str) -> bool:
        query = select(exists().where(receipts.c.receipt_id == receipt_id))
        return bool(self.conn.execute(query).scalar())

    def advance_head(self) -> tuple[int, str] | None:
        statement = (
            update(receipt_chain)
            .where(receipt_chain.c.id == 1)
            .values(seq=receipt_chain.c.seq + 1)
            .returning(receipt_chain.c.seq, receipt_chain.c.hash)
        )
        row = self.conn.execute(statement).first()
        return None if row is None else (int(row[0]), row[1])

    def insert_receipt(self, receipt: Receipt) -> bool:
        return self._insert_new(receipts, "receipt_id", codec.receipt_to_row(receipt))

    def set_head_hash(self, hash: str) -> None:
        self.conn.execute(update(receipt_chain).where(receipt_chain.c.id == 1).values(hash=hash))

    def list_receipts(self) -> list[Receipt | UnreadableReceipt]:
        query = select(receipts).order_by(receipts.c.seq.asc().nulls_first(), receipts.c.receipt_id)
        return [codec.receipt_from_row(r) for r in self.conn.execute(query).mappings()]

    def head(self) -> tuple[int, str] | None:
        query = select(receipt_chain.c.seq, receipt_chain.c.hash).where(receipt_chain.c.id == 1)
        row = self.conn.execute(query).first()
        return None if row is None else (int(row[0]), row[1])


class SQLStateStore(StoreOps):
    """The store over a SQLAlchemy engine: each write one transaction, each thread one connection.

    A dialect subclass provides the engine, how a write transaction begins (``_begin_write``),
    and how driver errors read (``_driver_error``, ``_commit_error``).
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime]) -> None:
        super().__init__(clock=clock)
        self.engine = engine
        self._insert = _dialect_insert(engine.dialect.name)
        self._local = threading.local()
        self._connections: list[Connection] = []
        self._connections_lock = threading.Lock()
        self._generation = 0

    # -- dialect hooks

    def _begin_write(self, conn: Connection) -> Any:
        return conn.begin()

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
        try:
            transaction = self._begin_write(conn)
        except SQLAlchemyError as exc:
            raise self._driver_error(exc, "starting a write") from None
        kept: CTRLRunError | None = None
        try:
            result = operation(SQLTx(conn, self._insert), self._now())
        except KeptWrite as exc:
            kept = exc.error
        except SQLAlchemyError as exc:
            self._rollback(transaction)
            raise self._driver_error(exc, "writing") from None
        except BaseException:
            self._rollback(transaction)
            raise
        try:
            transaction.commit()
        except (SQLAlchemyError, OSError) as exc:
            self._rollback(transaction)
            raise self._commit_error(exc) from None
        if kept is not None:
            raise kept
        return result

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:
        conn = self._conn()
        try:
            return operation(SQLTx(conn, self._insert), self._now())
        except (SQLAlchemyError, UnicodeError) as exc:
            raise self._driver_error(exc, "reading") from None
        finally:
            try:
                conn.rollback()
            except Exception:
                pass
