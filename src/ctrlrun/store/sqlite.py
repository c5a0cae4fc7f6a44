"""``SQLiteStateStore``: the default store, one file shared by the processes of one host."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from .._time import utc_now
from ..errors import CTRLRunError, InvalidArgument, SchemaMismatch, StoreError, StoreUnavailable
from .schema import HEAD, MIGRATIONS, apply_migrations, classify, read_schema, running_version
from .sql import SQLStateStore
from .sqlstraight import SQLStraightWrites

__all__ = ["SQLiteStateStore"]

_BUSY_SECONDS = 5.0
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
_MIN_SQLITE = (3, 35, 0)

# The sqlite3 module looks a bound None up as something to adapt, failing two attribute lookups
# each time (about 0.7 µs a parameter; an allowed call binds a dozen). Registered as adapting to
# itself, it binds as NULL exactly as before, at once. One another library registered first stays.
sqlite3.adapters.setdefault((type(None), sqlite3.PrepareProtocol), {}.get)


def _file_path(path: Any) -> Path:
    try:
        raw = os.fspath(path)
    except TypeError:
        raise InvalidArgument(
            f"the SQLite store path must be a str or PathLike, got {path!r}"
        ) from None
    if not isinstance(raw, str):
        raise InvalidArgument(f"the SQLite store path must be text, got {raw!r}")
    if not raw.strip() or ":memory:" in raw or "mode=memory" in raw:
        raise InvalidArgument(
            f"{raw!r} names an in-memory SQLite database, which other processes cannot share; "
            "give SQLiteStateStore a file path"
        )
    return Path(raw).expanduser().absolute()


def _is_empty(path: Path) -> bool:
    try:
        if path.stat().st_size != 0:
            return False
        wal = path.with_name(path.name + "-wal")
        return not (wal.exists() and wal.stat().st_size > 0)
    except OSError:  # absent (a new store) or unreadable (opening it says why)
        return False


def _refuse_empty(path: Path) -> None:
    """An existing empty file is not a new store: once opened, a store always holds its schema,
    so an empty one was truncated or badly copied, and taking it as new would forget every
    effect it recorded. (Another process creating the store leaves it empty for a moment: that
    is waited for, within the busy budget.)"""
    deadline = time.monotonic() + _EMPTY_WAIT
    while _is_empty(path):
        if time.monotonic() >= deadline:
            raise InvalidArgument(
                f"{path} is an empty file, not a ctrlrun store: a store that was ever written "
                "holds its schema, so this one was truncated, copied badly, or its creation "
                "crashed. Restore it from a backup if it held a store: its committed effects are "
                "what stop a second execution. To start over on purpose, delete the file; the "
                "new store remembers none of the old one's effects, approvals or receipts, so "
                "every effect key can run again"
            )
        time.sleep(0.02)


_EMPTY_WAIT = _BUSY_SECONDS


class SQLiteStateStore(SQLStraightWrites, SQLStateStore):
    """The store in one SQLite file: WAL, ``BEGIN IMMEDIATE`` around every decide-and-write.

    ``durability="full"`` (default) syncs every commit so a reservation survives power loss;
    ``"normal"`` survives a process crash but may lose the last commits on power loss.
    ``migrate=False`` opens an existing store at the current schema only, creating nothing.
    ``read_only=True`` (with ``migrate=False``) also refuses every write and needs no write access
    to the file or its directory; where SQLite cannot share a WAL store with its writers from
    there (no ``-shm`` file and a read-only directory) it reads an immutable snapshot instead,
    and ``snapshot`` is True: writes other processes make meanwhile are not seen.
    """

    BEGIN_WRITE = "BEGIN IMMEDIATE"  # takes the write lock before the first read

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "full",
        clock: Callable[[], datetime] = utc_now,
        migrate: bool = True,
        read_only: bool = False,
    ) -> None:
        self._path = _file_path(path)
        _refuse_empty(self._path)
        if read_only and migrate:
            raise InvalidArgument(
                "read_only=True opens an existing store as it is; pass migrate=False with it"
            )
        self.read_only = read_only
        self.snapshot = False
        if durability not in _SYNCHRONOUS:
            raise InvalidArgument(f"durability must be 'full' or 'normal', got {durability!r}")
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise InvalidArgument(
                f"ctrlrun needs SQLite >= 3.35 (UPDATE ... RETURNING); this Python links "
                f"{sqlite3.sqlite_version}: upgrade Python or its SQLite"
            )
        self.durability = durability
        if migrate:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InvalidArgument(
                    f"cannot create the directory of {self._path}: {exc}"
                ) from None
            mode = "rwc"
        else:
            if not self._path.is_file():
                raise InvalidArgument(
                    f"no ctrlrun store at {self._path}; run a protected call first (it creates "
                    "the store) or point CTRLRUN_STATE / CTRLRUN_STORE_URL at the right file"
                )
            mode = "ro" if read_only else "rw"
        self._uri = f"{self._path.as_uri()}?mode={mode}"
        engine = create_engine("sqlite+pysqlite://", creator=self._connect, poolclass=NullPool)
        super().__init__(engine, clock=clock)
        self._open_or_close(migrate)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # -- connections and transactions

    def _connect(self) -> sqlite3.Connection:
        conn = self._new_connection()
        if self.read_only and not self.snapshot and not self._can_read(conn):
            conn.close()
            self.snapshot = True
            self._uri = f"{self._path.as_uri()}?mode=ro&immutable=1"
            conn = self._new_connection()
        return conn

    @staticmethod
    def _can_read(conn: sqlite3.Connection) -> bool:
        """False when a read-only connection cannot read because SQLite would need to create
        the WAL index (the ``-shm`` file) where it may not write."""
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as exc:
            lower = str(exc).lower()
            return "readonly" not in lower and "unable to open" not in lower
        return True

    def _new_connection(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._uri,
            uri=True,
            timeout=_BUSY_SECONDS,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout={int(_BUSY_SECONDS * 1000)}")
        if not self.read_only:  # a reader syncs nothing, and the pragma would open the WAL
            conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
        return conn

    def _read_only_refusal(self) -> CTRLRunError:
        return InvalidArgument(
            f"the SQLite store {self._path} is open read-only: this write was refused and "
            "nothing changed; to write, open it without read_only=True as a user who may write "
            "the file and its directory"
        )

    def _begin_write(self, dbapi: Any, cursor: Any) -> Any:
        if self.read_only:
            raise self._read_only_refusal()
        return super()._begin_write(dbapi, cursor)

    def _driver_error(self, exc: BaseException, doing: str) -> CTRLRunError:
        message = str(getattr(exc, "orig", None) or exc)
        lower = message.lower()
        if self.read_only and ("unable to open" in lower or "readonly" in lower):
            if doing in ("reading", "reading its schema", "connecting"):
                return InvalidArgument(
                    f"cannot read the SQLite store {self._path} ({message}); check that you "
                    "may read the file and its directory"
                )
            return self._read_only_refusal()
        if "locked" in lower or "busy" in lower:
            return StoreUnavailable(
                f"the SQLite store {self._path} is busy: another connection held its write lock "
                f"for more than {_BUSY_SECONDS:g} s while {doing} ({message}); this write was "
                "not kept"
            )
        if "not a database" in lower or "malformed" in lower or "encrypted" in lower:
            return InvalidArgument(
                f"{self._path} is not a SQLite database ({message}); restore the store from a "
                "backup, or point ctrlrun at the right state file. A new path starts an empty "
                "store that remembers none of this one's effects, so every key could run again"
            )
        if "unable to open" in lower or "readonly" in lower or "read-only" in lower:
            return InvalidArgument(
                f"cannot write the SQLite store {self._path} ({message}); check the path "
                "and its permissions"
            )
        if isinstance(exc, IntegrityError):
            return InvalidArgument(f"the SQLite store {self._path} refused a row: {message}")
        if isinstance(exc, UnicodeError):
            return InvalidArgument(f"a value cannot be stored as UTF-8 text: {message}")
        if self._transient(exc):  # an I/O error, a full disk, a lock: the file may take it later
            return StoreUnavailable(
                f"the SQLite store {self._path} failed while {doing} ({message}); this write was "
                "not kept"
            )
        return StoreError(f"the SQLite store {self._path} failed while {doing}: {message}")

    # -- opening: classify the schema, then migrate (or refuse)

    def _inspect(self) -> tuple[bool, dict[str, str], tuple[str, ...]]:
        conn = self._conn()
        try:
            return read_schema(conn)
        except SQLAlchemyError as exc:
            raise self._driver_error(exc, "reading its schema") from None
        finally:
            conn.rollback()

    def _open(self, migrate: bool) -> None:
        has_table, applied, others = self._inspect()
        missing = classify(has_table, applied, others)
        if not migrate:
            if missing:
                found = sorted(applied) or "no ctrlrun schema"
                raise InvalidArgument(
                    f"the store {self._path} is at {found}, not at {HEAD}; this command never "
                    "creates or upgrades a store: run a protected call with this ctrlrun (it "
                    "migrates the store) or restore the right file"
                )
            return
        self._ensure_wal()
        if missing:
            self._migrate()

    def _ensure_wal(self) -> None:
        conn = self._conn()
        deadline = time.monotonic() + _BUSY_SECONDS
        try:
            while True:
                try:
                    mode = conn.exec_driver_sql("PRAGMA journal_mode=WAL").scalar()
                except SQLAlchemyError as exc:
                    if "locked" not in str(exc).lower() and "busy" not in str(exc).lower():
                        raise self._driver_error(exc, "switching to WAL") from None
                    mode = None
                if str(mode).lower() == "wal":
                    return
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"the SQLite store {self._path} could not switch to WAL mode within "
                        f"{_BUSY_SECONDS:g} s (it reads {mode!r}); retry later"
                    )
                conn.rollback()
                time.sleep(0.02)
        finally:
            conn.rollback()

    def _migrate(self) -> None:
        conn = self._conn()
        try:
            transaction = self._begin_locked(conn)
        except SQLAlchemyError as exc:
            raise self._driver_error(exc, "locking it to migrate") from None
        applied: dict[str, str] = {}
        try:
            has_table, applied, others = read_schema(conn)  # re-read under the write lock
            missing = classify(has_table, applied, others)
            apply_migrations(conn, missing, create_version_table=not has_table)
            transaction.commit()
        except SchemaMismatch:
            self._rollback(transaction)
            raise
        except SQLAlchemyError as exc:
            self._rollback(transaction)
            raise SchemaMismatch(
                f"migrating {self._path} failed and was rolled back, the database is unchanged: "
                f"{getattr(exc, 'orig', exc)}",
                applied=tuple(sorted(applied)),
                known=MIGRATIONS,
                running=running_version(),
            ) from None
