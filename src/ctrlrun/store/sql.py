"""The SQL store shared by dialects: compiled statements on the driver, a connection per thread.

Every statement of the data path is defined once with SQLAlchemy Core (``statements.py``),
compiled once per dialect and schema, and sent the same way, always: straight to the driver's
cursor, with the transaction's ``BEGIN`` and ``COMMIT``. Nothing switches paths at run time;
``trace`` (a callable taking each message's text and parameters) sees what is sent. Opening a
store (the schema check, migrations) runs on SQLAlchemy's connection for the same thread, which
owns the driver connection the data path uses.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import SQLAlchemyError

from ..errors import AmbiguousWrite, CTRLRunError, StoreError, StoreUnavailable
from .ops import StoreOps
from .prepared import Prepared, prepare_form
from .rows import KeptWrite, Tx
from .sqltx import SQLTx
from .statements import Statements

__all__ = ["SQLStateStore", "SQLTx", "Statements", "Transaction"]

log = logging.getLogger("ctrlrun")
T = TypeVar("T")


class _Failed(Exception):
    """A write's driver error: ``error`` to raise, ``cause`` the driver's, and ``unknown``
    when the write may have been kept (its COMMIT went unanswered)."""

    def __init__(self, cause: BaseException, error: CTRLRunError, *, unknown: bool) -> None:
        super().__init__(str(error))
        self.cause, self.error, self.unknown = cause, error, unknown
Trace = Callable[[str, Sequence[Any] | None], None]
#: writes a statement's parameters into its text, or answers None to leave them to the driver
Render = Callable[[str, Sequence[Any]], "str | None"]


def _schema_of(engine: Engine) -> str | None:
    """The schema the engine's ``schema_translate_map`` puts unqualified tables in, if any."""
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    return translate.get(None)


class Transaction:
    """One write (``begin`` is its opening statement) or one read (``begin=None``) on the driver.

    ``run`` sends a statement and answers with the cursor. With ``fused``, the cursor takes
    several statements in one message (psycopg's client-side binding cursor): ``BEGIN`` is not
    sent alone but in front of the first statement, and ``run_and_commit`` sends a statement
    with the ``COMMIT``, so a transaction costs two round trips fewer. ``committing`` is true
    while a message carrying ``COMMIT`` is unanswered: an error then leaves the outcome unknown
    unless the transaction failed before it. With ``prepared`` (the connection's prepared
    statements), each statement is prepared on its first use, in a message of its own sent before
    the one it belongs to, and executed by name from then on.
    """

    def __init__(
        self, dbapi: Any, cursor: Any, begin: str | None, *, fused: bool = False,
        unique_error: type[BaseException] | tuple[()] = (), trace: Trace | None = None,
        prepared: Prepared | None = None, render: Render | None = None,
    ) -> None:  # fmt: skip
        self.dbapi = dbapi
        self.cursor = cursor
        self.fused = fused
        self.unique_error = unique_error
        self.committing = False
        self._trace = trace
        self._begin = begin
        self._prepared = prepared
        self._render = render
        self._open = False  # a transaction is open on the server
        if begin is not None and not fused:
            self._send(begin, None)
            self._open = True
        # ``run`` without its bookkeeping, where it has none to do (nothing traced, no BEGIN
        # waiting to ride along): the cursor's own execute, which answers with the cursor too
        plain = trace is None and prepared is None and render is None and (begin is None or not fused)
        self.direct = cursor.execute if plain else self.run

    def _send(self, text: str, parameters: Sequence[Any] | None) -> Any:
        if self._trace is not None:
            self._trace(text, parameters)
        if parameters is None:
            return self.cursor.execute(text)
        if self._render is not None:
            rendered = self._render(text, parameters)
            if rendered is not None:
                return self.cursor.execute(rendered)
        return self.cursor.execute(text, parameters)

    def _form(self, statement: str, prepared: Prepared) -> str:
        """What to send for ``statement``: its ``EXECUTE``, prepared here first if it is new."""
        text = prepared.known.get(statement)
        if text is None:
            form = prepare_form(statement)
            if form is None:
                text = statement
            else:
                self._send(form[0], None)
                text = form[1]
            prepared.known[statement] = text
        return text

    def run(self, statement: str, parameters: Sequence[Any] | None = None) -> Any:
        cursor = self.cursor
        if self._prepared is not None:
            statement = self._form(statement, self._prepared)
        if not self._open and self._begin is not None:  # fused: BEGIN rides with it
            self._send(f"{self._begin}; {statement}", parameters)
            self._open = True
            cursor.nextset()  # past BEGIN's result, to the statement's
        else:
            self._send(statement, parameters)
        return cursor

    def run_and_commit(self, statement: str, parameters: Sequence[Any] | None = None) -> Any:
        cursor = self.cursor
        if self._prepared is not None:  # before the COMMIT is in flight
            statement = self._form(statement, self._prepared)
        begun = not self._open
        text = f"{self._begin}; {statement}; COMMIT" if begun else f"{statement}; COMMIT"
        self._open, self.committing = True, True
        self._send(text, parameters)
        self._open, self.committing = False, False
        if begun:
            cursor.nextset()
        return cursor

    def commit(self) -> None:
        if self._open:
            if self._trace is not None:
                self._trace("COMMIT", None)
            self.dbapi.commit()
            self._open = False

    def rollback(self) -> None:
        was_open, self._open = self._open, False
        if self._trace is not None and was_open:
            self._trace("ROLLBACK", None)
        self.dbapi.rollback()


class SQLStateStore(StoreOps):
    """The store over a SQLAlchemy engine: each write one transaction, each thread one connection.

    A dialect subclass provides the engine, the statement that opens a write transaction
    (``BEGIN_WRITE``), and how driver errors read (``_driver_error``, ``_commit_error``).
    """

    BEGIN_WRITE = "BEGIN"
    FUSED = False  # the driver sends BEGIN and COMMIT with statements (see Transaction)
    prepares = False  # writes run as server-side prepared statements (see Transaction)
    _render: Render | None = None  # parameters written as literals (see Transaction)
    #: how long the outcome of a function that ran is retried (seconds); see _write_outcome
    outcome_deadline = 15.0
    _monotonic = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime]) -> None:
        super().__init__(clock=clock)
        self.engine = engine
        self.trace: Trace | None = None
        event.listen(engine, "begin", self._on_begin)
        self._statements = Statements(engine.dialect.name, _schema_of(engine))
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._errors: tuple[type[BaseException], ...] = (SQLAlchemyError, self._dbapi_error)
        self._unique_error: type[BaseException] | tuple[()] = ()
        self._local = threading.local()
        self._connections: list[Connection] = []
        self._connections_lock = threading.Lock()
        self._generation = 0
        self._prepared: weakref.WeakKeyDictionary[Any, Prepared] = weakref.WeakKeyDictionary()

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
        """A SQLAlchemy transaction opened with ``BEGIN_WRITE`` (schema work at open)."""
        conn.info["ctrlrun_write"] = True
        try:
            return conn.begin()
        finally:
            conn.info["ctrlrun_write"] = False

    def _cursor(self, dbapi: Any) -> Any:
        """The cursor the data path sends its statements on (one per connection)."""
        return dbapi.cursor()

    def _failed_first(self, transaction: Transaction) -> bool:
        """Whether a transaction whose message carried ``COMMIT`` failed before it (so nothing
        was committed); a dialect that cannot tell answers False (the outcome is unknown)."""
        return False

    def _driver_error(self, exc: BaseException, doing: str) -> CTRLRunError:
        if self._transient(exc):
            return StoreUnavailable(f"the store could not be used while {doing} ({exc}); nothing of this write was kept")
        return StoreError(f"the store failed while {doing}: {exc}")

    def _commit_error(self, exc: BaseException) -> CTRLRunError:
        return AmbiguousWrite(
            f"the store's COMMIT failed or went unanswered, so whether it kept the write is "
            f"unknown ({exc})"
        )

    # -- connections

    def _conn(self) -> Connection:
        """This thread's SQLAlchemy connection (opened on first use, renewed once lost)."""
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
                local.driver = None
        if conn.in_transaction():
            conn.rollback()
        return conn

    def _driver(self) -> tuple[Any, Any]:
        """This thread's driver connection and its cursor, for the data path."""
        local = self._local
        driver = getattr(local, "driver", None)
        if driver is not None and local.generation == self._generation:
            return driver  # type: ignore[no-any-return]
        dbapi = self._conn().connection.driver_connection
        driver = (dbapi, self._cursor(dbapi))
        prepared = self._prepared.get(dbapi) if self.prepares else None
        if prepared is None and self.prepares:  # the server holds them per connection
            prepared = self._prepared[dbapi] = Prepared()
        local.driver, local.prepared = driver, prepared
        return driver

    def _lost(self, exc: BaseException) -> None:
        """Drop this thread's connection when a driver error says it is gone."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None:
            return
        try:
            error: Any = exc
            if self.engine.dialect.is_disconnect(error, conn.connection.dbapi_connection, None):
                local.driver = None
                conn.invalidate(error)
        except Exception:  # judging it is best effort; the next write reconnects anyway
            local.driver = None

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

    def _begin_write(self, dbapi: Any, cursor: Any) -> Transaction:
        """Open the transaction of one write (``BEGIN_WRITE`` sent, or deferred when fused)."""
        prepared = self._local.prepared
        return Transaction(dbapi, cursor, self.BEGIN_WRITE, fused=self.FUSED,
                           unique_error=self._unique_error, trace=self.trace,
                           prepared=prepared, render=self._render)  # fmt: skip

    @staticmethod
    def _rollback(transaction: Any) -> None:
        try:
            transaction.rollback()
        except Exception:  # the connection may already be gone
            pass

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:
        try:
            return self._try_write(operation)
        except _Failed as failed:
            raise failed.error from None

    def _try_write(self, operation: Callable[[Tx, datetime], T]) -> T:
        """One write transaction; a driver error comes out as ``_Failed`` (with what it means
        for the caller, and whether the write may have been kept)."""
        dbapi, cursor = self._driver()
        self._count()
        errors = self._errors
        try:
            transaction = self._begin_write(dbapi, cursor)
        except errors as exc:
            self._lost(exc)
            raise _Failed(exc, self._driver_error(exc, "starting a write"), unknown=False) from None
        kept: CTRLRunError | None = None
        tx = SQLTx(transaction, self._statements)
        try:
            result = operation(tx, self._now())
        except KeptWrite as exc:
            kept = exc.error
        except errors as exc:
            self._lost(exc)
            unknown = transaction.committing and not self._failed_first(transaction)
            self._rollback(transaction)
            if unknown:  # the COMMIT sent with the statement may have been carried out
                raise _Failed(exc, self._commit_error(exc), unknown=True) from None
            raise _Failed(exc, self._driver_error(exc, "writing"), unknown=False) from None
        except BaseException:
            self._rollback(transaction)
            raise
        try:
            transaction.commit()
        except (*errors, OSError) as exc:  # type: ignore[misc]
            self._lost(exc)
            self._rollback(transaction)
            raise _Failed(exc, self._commit_error(exc), unknown=True) from None
        if kept is not None:
            raise kept
        return result

    def _write_outcome(
        self, operation: Callable[[Tx, datetime], T], landed: Callable[[Tx, datetime], T | None]
    ) -> T:
        """The outcome of a function that ran is written hard: a write that failed for a
        passing reason (a lost connection, a busy or restarting server, a lock or statement
        timeout) is sent again on a fresh connection until ``outcome_deadline`` seconds have
        passed, and one whose answer was lost is first read back (``landed``), never written
        twice. The error left at the deadline is the last one seen."""
        deadline = self._monotonic() + self.outcome_deadline
        delay = 0.05
        unanswered = False  # a write was sent whose answer was lost: read before writing again
        while True:
            failed: _Failed
            try:
                if unanswered:
                    found = self._read(landed)
                    if found is not None:
                        return found
                    unanswered = False
                return self._try_write(operation)
            except _Failed as exc:
                failed = exc
                unanswered = unanswered or exc.unknown
                if not exc.unknown and not self._transient(exc.cause):
                    raise exc.error from None
            except CTRLRunError as exc:  # the read back failed: still unanswered
                if not unanswered:
                    raise
                failed = _Failed(exc, exc, unknown=True)
            if self._monotonic() + delay > deadline:
                raise failed.error from None
            log.warning("the store write of an outcome failed (%s); trying again", failed.error)
            self._sleep(delay)
            delay = min(delay * 2, 1.0)

    def _transient(self, exc: BaseException) -> bool:
        """Whether a driver error passes: the server or the file may take the write later."""
        original = getattr(exc, "orig", None) or exc
        return any(k.__name__ in ("OperationalError", "InterfaceError") for k in type(original).__mro__)

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:
        dbapi, cursor = self._driver()
        transaction = Transaction(dbapi, cursor, None, trace=self.trace, render=self._render)
        try:
            return operation(SQLTx(transaction, self._statements), self._now())
        except (*self._errors, UnicodeError) as exc:  # type: ignore[misc]
            self._lost(exc)
            raise self._driver_error(exc, "reading") from None
