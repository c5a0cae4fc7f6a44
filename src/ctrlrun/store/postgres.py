"""``PostgresStateStore``: the store in one Postgres schema, shared by processes on many hosts.

Public as ``ctrlrun.postgres.PostgresStateStore`` (that module re-exports this one's names); not
re-exported by ``ctrlrun``. The driver (psycopg 3, extra ``ctrlrun[postgres]``) is imported only
when a store is built, so ``import ctrlrun`` never needs it.

How it keeps the store's promises across hosts:

- isolation stays READ COMMITTED (the server default); no advisory lock on the hot path. Every
  decision is made safe by unique constraints (``INSERT … ON CONFLICT DO NOTHING``) and by
  compare-and-set updates whose row count is checked (the shared code in ``store.ops``);
- connections run in autocommit; each write opens an explicit ``BEGIN`` and ends it, so no
  connection sits idle in a transaction;
- no session state: every statement names the schema (SQLAlchemy ``schema_translate_map``), no
  ``SET``, no server-side prepared statements, so a transaction-mode pooler (PgBouncer) is safe;
- the receipt head row's ``UPDATE … RETURNING`` is a row lock: receipt writers serialize;
- an error from ``COMMIT`` (other than SQLSTATE 40001/40P01, which roll back) leaves the outcome
  unknown: ``AmbiguousWrite``, never a retry, never ``failed``;
- migrations run inside one transaction under ``pg_advisory_xact_lock``, so a fleet restarting at
  once all succeed, and only the first one migrates.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .._time import utc_now
from ..errors import CTRLRunError, InvalidArgument, MissingDependency, SchemaMismatch
from .schema import (
    HEAD,
    MIGRATIONS,
    apply_migrations,
    classify,
    read_schema,
    running_version,
)
from .sql import SQLStateStore

__all__ = ["PostgresStateStore", "clock_skew", "split_store_url"]

log = logging.getLogger("ctrlrun")

SCHEMA_PARAMETER = "ctrlrun_schema"
# pg_advisory_xact_lock key taken by every migration (any schema): "ctrlrun" in ASCII.
MIGRATION_LOCK_KEY = 0x6374726C72756E
_SCHEMES = ("postgresql://", "postgres://")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CONNECT_TIMEOUT = 10
_NOTHING_COMMITTED = {"40001", "40P01"}  # serialization failure, deadlock: rolled back
_SKEW = timedelta(seconds=1)


def split_store_url(url: str) -> tuple[str, str | None]:
    """``(libpq URL, schema or None)``: ``ctrlrun_schema`` taken out, everything else kept."""
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise InvalidArgument(
            f"a Postgres store URL starts with postgresql:// or postgres://, got {url!r}"
        )
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for name, value in pairs if name == SCHEMA_PARAMETER]
    if len(schemas) > 1:
        raise InvalidArgument(f"the store URL names {SCHEMA_PARAMETER} more than once")
    if schemas and not schemas[0]:
        raise InvalidArgument(f"the store URL's {SCHEMA_PARAMETER} is empty; name a schema")
    rest = urlencode([(name, value) for name, value in pairs if name != SCHEMA_PARAMETER])
    return urlunsplit(parts._replace(query=rest)), (schemas[0] if schemas else None)


def _check_schema_name(schema: Any) -> str:
    if (
        not isinstance(schema, str)
        or not _IDENTIFIER.match(schema)
        or len(schema.encode("utf-8")) > 63
    ):
        raise InvalidArgument(
            f"schema must be a plain SQL identifier (letters, digits, _; at most 63 bytes), "
            f"got {schema!r}"
        )
    return schema


def clock_skew(local: datetime, server: Any, rtt: float) -> timedelta | None:
    """How far ``local`` is from ``server`` beyond the measurement's uncertainty (the round
    trip), when that exceeds one second; else ``None``."""
    if not isinstance(server, datetime):
        return None
    if server.tzinfo is None:
        server = server.replace(tzinfo=timezone.utc)
    skew = abs(local - server) - timedelta(seconds=max(rtt, 0.0))
    return skew if skew > _SKEW else None


def _sqlstate(exc: BaseException) -> str | None:
    original = getattr(exc, "orig", None) or exc
    return getattr(original, "sqlstate", None)


def _message(exc: BaseException) -> str:
    original = getattr(exc, "orig", None) or exc
    return str(original).strip() or type(original).__name__


class PostgresStateStore(SQLStateStore):
    """The store in one Postgres schema: threads, processes and hosts share it safely.

    ``url`` is a libpq URL (``postgresql://user@host/db``; ``postgres://`` too) and may carry
    ``?ctrlrun_schema=<name>``, which is taken out before the URL reaches the driver. ``schema``
    must already exist (none is created) and, unless ``migrate=False``, the role must hold
    ``CREATE`` on it. ``migrate=False`` opens a store already at the current schema version and
    changes nothing (the operator commands' path). A newer schema is refused
    (``SchemaMismatch``): upgrade every reader before any writer.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        clock: Callable[[], datetime] = utc_now,
        migrate: bool = True,
    ) -> None:
        if isinstance(url, str) and url.startswith("postgresql+psycopg://"):
            url = "postgresql://" + url[len("postgresql+psycopg://") :]
        conninfo, named = split_store_url(url)
        schema = _check_schema_name(schema)
        if named is not None:
            named = _check_schema_name(named)
            if schema not in ("public", named):
                raise InvalidArgument(
                    f"the URL names schema {named!r} but schema={schema!r} was passed; give one"
                )
            schema = named
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:
            raise MissingDependency(
                "the Postgres store needs psycopg 3: run pip install '.[postgres]' from the root "
                "of your ctrlrun clone (the 'ctrlrun' on PyPI is another project)",
                module="psycopg",
                extra="postgres",
            ) from None
        if tuple(int(part) for part in re.findall(r"\d+", psycopg.__version__)[:2]) < (3, 1):
            raise MissingDependency(
                f"the Postgres store needs psycopg >= 3.1, found {psycopg.__version__}: "
                "run pip install -U '.[postgres]' from the root of your ctrlrun clone",
                module="psycopg",
                extra="postgres",
            )
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            raise InvalidArgument(f"cannot read the Postgres URL: {exc}") from None
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._params = params
        self._schema = schema
        self.migrate = migrate
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        engine = create_engine(
            "postgresql+psycopg://",
            creator=self._connect,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
        ).execution_options(schema_translate_map={None: schema})
        super().__init__(engine, clock=clock)
        self._unique_error = psycopg.errors.UniqueViolation
        self._open_or_close(migrate)

    FUSED = True  # BEGIN and COMMIT ride with the statements

    @property
    def schema(self) -> str:
        """The Postgres schema holding the tables."""
        return self._schema

    @property
    def target(self) -> str:
        """``user@host:port/dbname`` (no password), as messages name the server."""
        p = self._params
        host = p.get("host") or p.get("hostaddr") or "localhost"
        port = f":{p['port']}" if p.get("port") else ""
        user = f"{p['user']}@" if p.get("user") else ""
        return f"{user}{host}{port}/{p.get('dbname') or '(default)'} schema {self._schema}"

    # -- connections and transactions

    def _connect(self) -> Any:
        extra: dict[str, Any] = {}
        if "connect_timeout" not in self._params:
            extra["connect_timeout"] = _CONNECT_TIMEOUT
        if "client_encoding" not in self._params:
            extra["client_encoding"] = "UTF8"
        # prepare_threshold=None: no server-side prepared statements (session state).
        return self._psycopg.connect(
            self._conninfo, autocommit=True, prepare_threshold=None, **extra
        )

    def _cursor(self, dbapi: Any) -> Any:
        # client-side binding, so BEGIN and COMMIT travel with statements (one message each)
        return self._psycopg.ClientCursor(dbapi)

    def _failed_first(self, transaction: Any) -> bool:
        # a statement failed and the COMMIT after it in the message never ran
        status = transaction.dbapi.info.transaction_status
        return bool(status == self._psycopg.pq.TransactionStatus.INERROR)

    def _driver_error(self, exc: BaseException, doing: str) -> CTRLRunError:
        state = _sqlstate(exc) or ""
        message = _message(exc)
        where = f"the Postgres store ({self.target})"
        if "NUL" in message and "0x00" in message:
            return InvalidArgument(f"{where} cannot keep a NUL character: {message}")
        if isinstance(exc, UnicodeError) or state in ("22021", "22P05"):
            return InvalidArgument(f"a value cannot be stored as UTF-8 text in {where}: {message}")
        if state.startswith("23"):
            return InvalidArgument(f"{where} refused a row: {message}")
        if state == "42501":
            return InvalidArgument(
                f"{where}: permission denied while {doing} ({message}); the role needs "
                f"GRANT USAGE, CREATE ON SCHEMA {self._schema} and rights on its tables"
            )
        if state in _NOTHING_COMMITTED:
            return CTRLRunError(
                f"{where} rolled the write back ({message}) while {doing}; nothing was "
                "written: retry"
            )
        original = getattr(exc, "orig", None) or exc
        lost = type(original).__name__ in ("OperationalError", "InterfaceError")
        if state.startswith(("08", "57P")) or (lost and not state):
            return CTRLRunError(f"cannot reach {where} while {doing}: {message}")
        return CTRLRunError(f"{where} failed while {doing}: {message}")

    def _commit_error(self, exc: BaseException) -> CTRLRunError:
        if _sqlstate(exc) in _NOTHING_COMMITTED:
            return self._driver_error(exc, "committing")
        return super()._commit_error(exc)

    # -- opening: check the database, classify the schema, migrate (or refuse)

    def _open(self, migrate: bool) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        conn = self._conn()
        try:
            encoding, exists, usage, create, server_now, rtt = self._probe(conn)
            if encoding.upper() not in ("UTF8", "UTF-8"):
                raise InvalidArgument(
                    f"the database of {self.target} uses encoding {encoding}, not UTF8; a lossy "
                    "encoding could make two effect keys one: create the database WITH "
                    "ENCODING 'UTF8'"
                )
            if not exists:
                raise InvalidArgument(
                    f"schema {self._schema!r} does not exist in {self.target}; ctrlrun creates "
                    f'none: run CREATE SCHEMA "{self._schema}" (names are case-sensitive) and '
                    "grant the role USAGE and CREATE on it"
                )
            if not usage or (migrate and not create):
                missing = "USAGE, CREATE" if not usage else "CREATE"
                raise InvalidArgument(
                    f"the role cannot {'use' if not usage else 'create tables in'} schema "
                    f"{self._schema!r} of {self.target}: run GRANT {missing} ON SCHEMA "
                    f'"{self._schema}" TO <role>'
                )
            self._check_skew(server_now, rtt)
            version = conn.exec_driver_sql("SHOW server_version_num").scalar()
            # sha256() is built in from PostgreSQL 11: older servers get the receipt's hash
            # from this host, in a second message
            self._statements.places = int(version or 0) >= 110000
            has_table, applied, others = read_schema(conn, self._schema)
        except SQLAlchemyError as exc:
            raise self._driver_error(exc, "reading its schema") from None
        finally:
            try:
                conn.rollback()
            except Exception:  # the connection may be gone; the error above says why
                pass
        missing_ids = classify(has_table, applied, others)
        if not missing_ids:
            return
        if not migrate:
            found = sorted(applied) or "no ctrlrun schema"
            raise InvalidArgument(
                f"the store in {self.target} is at {found}, not at {HEAD}; this command never "
                "creates or upgrades a store: run a protected call with this ctrlrun (it "
                "migrates the store) or point --store-url / CTRLRUN_STORE_URL at the right one"
            )
        self._migrate()

    def _probe(self, conn: Any) -> tuple[str, bool, bool, bool, datetime, float]:
        from sqlalchemy import text

        started = time.monotonic()
        row = conn.execute(
            text(
                "SELECT pg_encoding_to_char(d.encoding), n.oid IS NOT NULL, "
                "CASE WHEN n.oid IS NULL THEN false "
                "ELSE has_schema_privilege(n.oid, 'USAGE') END, "
                "CASE WHEN n.oid IS NULL THEN false "
                "ELSE has_schema_privilege(n.oid, 'CREATE') END, "
                "clock_timestamp() "
                "FROM pg_database d LEFT JOIN pg_namespace n ON n.nspname = :schema "
                "WHERE d.datname = current_database()"
            ),
            {"schema": self._schema},
        ).one()
        rtt = time.monotonic() - started
        return str(row[0]), bool(row[1]), bool(row[2]), bool(row[3]), row[4], rtt

    def _check_skew(self, server_now: datetime, rtt: float) -> None:
        """Warn (decide nothing) when this host's clock and the server's disagree by > 1 s."""
        if self.clock is not utc_now:
            return  # an injected clock is not meant to tell the real time
        skew = clock_skew(utc_now(), server_now, rtt)
        if skew is not None:
            log.warning(
                "this host's clock differs from the Postgres server's (%s) by about %.1f s; "
                "leases are judged by this host's clock: synchronise it (NTP)",
                self.target,
                skew.total_seconds(),
            )

    def _migrate(self) -> None:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        conn = self._conn()
        try:
            transaction = self._begin_locked(conn)
        except SQLAlchemyError as exc:
            raise self._driver_error(exc, "starting its migration") from None
        applied: dict[str, str] = {}
        try:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            has_table, applied, others = read_schema(conn, self._schema)  # under the lock
            missing = classify(has_table, applied, others)
            apply_migrations(
                conn, missing, create_version_table=not has_table, schema=self._schema
            )
        except SchemaMismatch:
            self._rollback(transaction)
            raise
        except SQLAlchemyError as exc:
            self._rollback(transaction)
            if _sqlstate(exc) == "42501":
                raise self._driver_error(exc, "migrating") from None
            raise SchemaMismatch(
                f"migrating {self.target} failed and was rolled back, the schema is unchanged: "
                f"{_message(exc)}",
                applied=tuple(sorted(applied)),
                known=MIGRATIONS,
                running=running_version(),
            ) from None
        except BaseException:
            self._rollback(transaction)
            raise
        try:
            transaction.commit()
        except SQLAlchemyError as exc:
            self._rollback(transaction)
            raise SchemaMismatch(
                f"the COMMIT of the migration of {self.target} failed ({_message(exc)}); open "
                "the store again: a migration either applied whole or not at all",
                applied=tuple(sorted(applied)),
                known=MIGRATIONS,
                running=running_version(),
            ) from None
