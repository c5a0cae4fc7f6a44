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
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import SQLAlchemyError

from ..errors import AmbiguousWrite, CTRLRunError
from .ops import StoreOps
from .rows import KeptWrite, Tx
from .sqltx import SQLTx
from .statements import Statements

__all__ = ["DirectWrite", "SQLStateStore", "SQLTx", "Statements"]

T = TypeVar("T")


def _schema_of(engine: Engine) -> str | None:
    """The schema the engine's ``schema_translate_map`` puts unqualified tables in, if any."""
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    return translate.get(None)


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
