"""``PostgresStateStore``: the store in one Postgres schema, shared by processes on many hosts.

Public as ``ctrlrun.postgres.PostgresStateStore`` (that module re-exports this one's names); not
re-exported by ``ctrlrun``. The driver (psycopg 3, the ``postgres`` extra: ``pip install
'.[postgres]'`` from the clone) is imported only when a store is built, so ``import ctrlrun``
never needs it.

How it keeps the store's promises across hosts:

- isolation stays READ COMMITTED (the server default); no advisory lock on the hot path. Every
  decision is made safe by unique constraints (``INSERT … ON CONFLICT DO NOTHING``) and by
  compare-and-set updates whose row count is checked (the shared code in ``store.ops``);
- connections run in autocommit; each write opens an explicit ``BEGIN`` and ends it, so no
  connection sits idle in a transaction; every write that moves the receipt chain head is one
  message (``BEGIN; …; COMMIT``), so the head's row lock never outlives a message;
- every wait is bounded (``PostgresTimeouts``): lock, statement and idle-in-transaction timeouts
  ride in the ``options`` startup parameter; TCP keepalives and ``tcp_user_timeout`` notice a
  dead server; a lock or statement timeout is "nothing was written: retry";
- this host's clock is compared with the server's at open and then at most once a minute;
  beyond ``max_clock_skew`` the writes (which judge leases and expiry) are refused
  (``ClockSkew``);
- no session state: every statement names the schema (SQLAlchemy ``schema_translate_map``), no
  ``SET``, no server-side prepared statements unless ``prepared=True`` asks for them, so a
  transaction-mode pooler (PgBouncer) is safe;
- the receipt head row's ``UPDATE … RETURNING`` is a row lock: receipt writers serialize;
- an error from ``COMMIT`` (other than SQLSTATE 40001/40P01, which roll back) leaves the outcome
  unknown: ``AmbiguousWrite``, never a retry, never ``failed``;
- migrations run inside one transaction under ``pg_advisory_xact_lock``, so a fleet restarting at
  once all succeed, and only the first one migrates.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from .._time import utc_now
from ..evidence.drafts import EventRow, ReceiptDraft
from ..errors import (
    ClockSkew,
    CTRLRunError,
    InvalidArgument,
    MissingDependency,
    SchemaMismatch,
)
from ..evidence.receipt import Event, Receipt
from .pgtimeouts import (
    PREPARED_PARAMETER,
    SKEW_PARAMETER,
    STARTUP_PARAMETER,
    PostgresTimeouts,
    connect_parameters,
    take_query,
    take_url_settings,
)
from .pgerrors import NOTHING_COMMITTED, driver_error, message_of, sqlstate
from .pgliteral import Literals
from .prepared import MISSING_PREPARED
from .placing import as_draft, place_with_events, placed_receipt
from .rows import Tx
from .settle import finish_landed
from .schema import (
    HEAD,
    MIGRATIONS,
    apply_migrations,
    classify,
    read_schema,
    running_version,
)
from .sql import SQLStateStore
from .statements import EVENTS_PER_STATEMENT
from .steps import _check_id, _stored, event_rows

__all__ = ["PostgresStateStore", "PostgresTimeouts", "clock_skew", "split_store_url"]

T = TypeVar("T")

log = logging.getLogger("ctrlrun")

SCHEMA_PARAMETER = "ctrlrun_schema"
# pg_advisory_xact_lock key taken by every migration (any schema): "ctrlrun" in ASCII.
MIGRATION_LOCK_KEY = 0x6374726C72756E
_SCHEMES = ("postgresql://", "postgres://")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SKEW = timedelta(seconds=1)
MAX_CLOCK_SKEW = 5.0  # seconds
CLOCK_CHECK_INTERVAL = 60.0  # seconds between two measurements of the server's clock
_CLOCK_QUERY = "SELECT clock_timestamp()"


def split_store_url(url: str) -> tuple[str, str | None]:
    """``(libpq URL, schema or None)``: ``ctrlrun_schema`` taken out, everything else kept."""
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise InvalidArgument(
            f"a Postgres store URL starts with postgresql:// or postgres://, got {url!r}"
        )
    rest, taken = take_query(url, (SCHEMA_PARAMETER,))
    schemas = [value for _, value in taken]
    if len(schemas) > 1:
        raise InvalidArgument(f"the store URL names {SCHEMA_PARAMETER} more than once")
    if schemas and not schemas[0]:
        raise InvalidArgument(f"the store URL's {SCHEMA_PARAMETER} is empty; name a schema")
    return rest, (schemas[0] if schemas else None)


_OWN_PARAMETERS = (SCHEMA_PARAMETER, PREPARED_PARAMETER, STARTUP_PARAMETER, SKEW_PARAMETER)
_SCHEMA_LOOKALIKES = ("schema", "search_path", "currentschema", "current_schema")


def _url_problem(exc: BaseException) -> str:
    """libpq's complaint about a URL, on one line; a query parameter it does not know is named
    beside the ones ctrlrun reads itself (a schema goes in ``ctrlrun_schema``)."""
    message = message_of(exc)
    unknown = re.search(r'invalid URI query parameter: "([^"]*)"', message)
    if unknown is None:
        return message
    name = unknown.group(1)
    if name.lower() in _SCHEMA_LOOKALIKES:
        return (f"{message}: libpq has no {name!r} parameter; name the schema with "
                f"{SCHEMA_PARAMETER}=<schema> (e.g. ?{SCHEMA_PARAMETER}=ctrlrun)")  # fmt: skip
    return (f"{message}: {name!r} is neither a libpq connection parameter nor one of ctrlrun's "
            f"own ({', '.join(_OWN_PARAMETERS)})")  # fmt: skip


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


def clock_skew(
    local: datetime, server: Any, rtt: float, limit: timedelta = _SKEW
) -> timedelta | None:
    """How far ``local`` is from ``server`` beyond the measurement's uncertainty (the round
    trip), when that exceeds ``limit`` (one second); else ``None``."""
    if not isinstance(server, datetime):
        return None
    if server.tzinfo is None:
        server = server.replace(tzinfo=timezone.utc)
    skew = abs(local - server) - timedelta(seconds=max(rtt, 0.0))
    return skew if skew > limit else None


def _check_skew_limit(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value > 0
    ):
        raise InvalidArgument(
            f"max_clock_skew must be None (no check) or a number of seconds > 0, got {value!r}"
        )
    return float(value)


class PostgresStateStore(SQLStateStore):
    """The store in one Postgres schema: threads, processes and hosts share it safely.

    ``url`` is a libpq URL (``postgresql://user@host/db``; ``postgres://`` too) and may carry
    ``?ctrlrun_schema=<name>``, which is taken out before the URL reaches the driver. ``schema``
    must already exist (none is created) and, unless ``migrate=False``, the role must hold
    ``CREATE`` on it. ``migrate=False`` opens a store already at the current schema version and
    changes nothing (the operator commands' path). A newer schema is refused
    (``SchemaMismatch``): upgrade every reader before any writer.

    ``timeouts`` bounds every wait (``PostgresTimeouts``, defaults: lock 5 s, statement 15 s,
    idle in transaction 15 s, connect 10 s, keepalives after 5 s idle, ``tcp_user_timeout``
    10 s); what the URL sets itself wins. ``max_clock_skew`` (seconds, default 5; ``None``: no
    check) is how far this host's clock may be off the server's before writes are refused
    (``ClockSkew``); it is measured at open and at most once a minute after. An injected
    ``clock`` is not checked. The URL may carry ``ctrlrun_startup_options=off`` and
    ``ctrlrun_max_clock_skew=<seconds|off>``, which win over the keywords.

    ``prepared=True`` (or ``ctrlrun_prepared=on``) runs the writes as server-side prepared
    statements, so the server plans each once per connection instead of on every call: for a
    direct connection or a session-mode pooler only, since a transaction-mode pooler does not
    keep them.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        clock: Callable[[], datetime] = utc_now,
        migrate: bool = True,
        timeouts: PostgresTimeouts | None = None,
        max_clock_skew: float | None = MAX_CLOCK_SKEW,
        prepared: bool = False,
    ) -> None:
        if isinstance(url, str) and url.startswith("postgresql+psycopg://"):
            url = "postgresql://" + url[len("postgresql+psycopg://") :]
        conninfo, named = split_store_url(url)
        conninfo, settings = take_url_settings(conninfo)
        if timeouts is None:
            timeouts = PostgresTimeouts()
        elif not isinstance(timeouts, PostgresTimeouts):
            raise InvalidArgument(f"timeouts must be a PostgresTimeouts or None, got {timeouts!r}")
        if "startup_options" in settings:
            from dataclasses import replace

            timeouts = replace(timeouts, startup_options=settings["startup_options"])
        self.timeouts = timeouts
        self.in_force: dict[str, str] = {}  # the server's timeouts as a session of this store has them
        self.max_clock_skew = _check_skew_limit(settings.get("max_clock_skew", max_clock_skew))
        self.prepares = bool(settings.get("prepared", prepared))
        self.clock_check_interval = CLOCK_CHECK_INTERVAL
        # the clock is judged only when it is meant to tell the real time
        self._judges_clock = clock is utc_now and self.max_clock_skew is not None
        self._ticks: Callable[[], float] = time.monotonic
        self._clock_due = 0.0
        self._skew: timedelta | None = None
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
            raise InvalidArgument(f"cannot read the Postgres URL: {_url_problem(exc)}") from None
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
        self._render = Literals().render
        self._open_or_close(migrate)

    FUSED = True  # BEGIN and COMMIT ride with the statements
    _host_now = staticmethod(utc_now)  # this host's clock, as the skew check reads it

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

    def _stream_after(self, after_seq: int) -> Iterator[Any]:
        from .snapshot import stream_receipts  # a server-side cursor for a whole stream

        return stream_receipts(self, after_seq)

    def _connect(self) -> Any:
        extra = connect_parameters(self._params, self.timeouts)
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
        if sqlstate(exc) == MISSING_PREPARED and self._local.prepared is not None:
            self._local.prepared.forget()  # prepared again by the next write
        return driver_error(exc, doing, self, transient=self._transient(exc))

    def _transient(self, exc: BaseException) -> bool:
        return sqlstate(exc) == MISSING_PREPARED or super()._transient(exc)

    def _commit_error(self, exc: BaseException) -> CTRLRunError:
        if sqlstate(exc) in NOTHING_COMMITTED:
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
            self._check_skew(self._host_now(), server_now, rtt)
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
                "clock_timestamp(), current_setting('lock_timeout'), "
                "current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout') "
                "FROM pg_database d LEFT JOIN pg_namespace n ON n.nspname = :schema "
                "WHERE d.datname = current_database()"
            ),
            {"schema": self._schema},
        ).one()
        rtt = time.monotonic() - started
        names = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
        self.in_force = {name: str(value) for name, value in zip(names, row[5:8])}
        return str(row[0]), bool(row[1]), bool(row[2]), bool(row[3]), row[4], rtt

    def _check_skew(self, local: datetime, server_now: Any, rtt: float) -> None:
        """Keep the measured skew when it exceeds ``max_clock_skew``; warn past one second."""
        if self.clock is not utc_now:
            return  # an injected clock is not meant to tell the real time
        self._clock_due = self._ticks() + self.clock_check_interval
        skew = clock_skew(local, server_now, rtt)
        limit = self.max_clock_skew
        self._skew = None
        if skew is not None and limit is not None and skew > timedelta(seconds=limit):
            self._skew = skew
        elif skew is not None:
            log.warning(
                "this host's clock differs from the Postgres server's (%s) by about %.1f s; "
                "leases are judged by this host's clock: synchronise it (NTP)",
                self.target,
                skew.total_seconds(),
            )

    def _read_clocks(self) -> tuple[datetime, Any, float]:
        """This host's time, the server's and the round trip, from one ``clock_timestamp()``."""
        dbapi, _ = self._driver()
        if self.trace is not None:
            self.trace(_CLOCK_QUERY, None)
        started = self._ticks()
        try:
            cursor = self._psycopg.ClientCursor(dbapi)
            cursor.execute(_CLOCK_QUERY)
            row = cursor.fetchone()
        except self._errors as exc:
            self._lost(exc)
            raise self._driver_error(exc, "reading the server's clock") from None
        return self._host_now(), (row[0] if row else None), self._ticks() - started

    def _judge_clock(self) -> None:
        """Refuse (``ClockSkew``) while this host's clock is too far off the server's; measure
        again once the last measurement is older than ``clock_check_interval`` (and before
        every write while it is off, so a fixed clock is seen at once)."""
        if self._skew is not None or self._ticks() >= self._clock_due:
            self._check_skew(*self._read_clocks())
        skew = self._skew
        if skew is not None:
            raise ClockSkew(
                f"the clock of this host ({socket.gethostname()}) is {skew.total_seconds():.1f}"
                f" s off the clock of the Postgres server ({self.target}), more than "
                f"max_clock_skew ({self.max_clock_skew:g} s): leases and approval expiry cannot "
                "be judged, so nothing was written; synchronise this host's clock (NTP: "
                "chronyc tracking, timedatectl), or raise max_clock_skew "
                "(PostgresStateStore(max_clock_skew=...) or ctrlrun_max_clock_skew= in the URL)",
                host=socket.gethostname(),
                server=self.target,
                skew=skew.total_seconds(),
                limit=self.max_clock_skew,
            )

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:
        if self._judges_clock:
            self._judge_clock()
        return super()._write(operation)

    # -- writes that move the chain head: one message each

    def _server_draft(
        self, receipt: Receipt | ReceiptDraft | None, rows: Sequence[Any]
    ) -> ReceiptDraft | None:
        """The draft the server places for ``receipt``, or ``None`` (placed the two-step way)."""
        if not self._statements.places or len(rows) > EVENTS_PER_STATEMENT:
            return None
        if isinstance(receipt, ReceiptDraft):
            return receipt
        return as_draft(receipt) if isinstance(receipt, Receipt) else None

    def record(
        self,
        *,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Append events and chain a receipt in one transaction, sent as one message."""
        return self._record(events, receipt, return_events, action_id=None)

    def _record(
        self, events: Sequence[Event | EventRow], receipt: Receipt | ReceiptDraft | None,
        return_events: bool, *, action_id: str | None,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:  # fmt: skip
        """``record``; with ``action_id`` it is the outcome of a function that ran (no effect
        key), written hard as every outcome is (retried, read back after a lost reply)."""
        rows = event_rows(events)
        draft = self._server_draft(receipt, rows)
        if draft is None:
            if action_id is None:
                return super().record(events=rows, receipt=receipt, return_events=return_events)
            return super().finish_attempt(
                effect_key=None, action_id=action_id, outcome=None, events=rows,
                receipt=receipt, return_events=return_events,
            )  # fmt: skip

        def write(tx: Any, now: datetime) -> tuple[Event, ...]:
            tx.returning = return_events
            return _stored(tx, rows, place_with_events(tx, rows, draft))

        def landed(tx: Any, now: datetime) -> tuple[Event, ...] | None:
            found = finish_landed(
                tx, effect_key=None, action_id=action_id or "", outcome=None, rows=rows,
                receipt=draft, return_events=return_events,
            )  # fmt: skip
            return None if found is None else found[0]

        stored = self._write(write) if action_id is None else self._write_outcome(write, landed)
        if isinstance(receipt, Receipt):
            return stored, placed_receipt(receipt, draft)
        return stored, draft

    def finish_attempt(
        self,
        *,
        effect_key: str | None,
        action_id: str,
        outcome: Any,
        result: Any = None,
        error: str | None = None,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """``StoreOps.finish_attempt``, with a receipt object placed by the server too."""
        if effect_key is None and outcome is None:  # no effect record to move: a record
            _check_id(action_id, "action_id")
            return self._record(events, receipt, return_events, action_id=action_id)
        draft = None
        if isinstance(receipt, Receipt) and events:  # the one-message finish writes events
            draft = self._server_draft(receipt, events)
        stored, placed = super().finish_attempt(
            effect_key=effect_key, action_id=action_id, outcome=outcome, result=result,
            error=error, events=events, receipt=draft or receipt, return_events=return_events,
        )  # fmt: skip
        if draft is not None and placed is draft:
            assert isinstance(receipt, Receipt)
            return stored, placed_receipt(receipt, draft)
        return stored, placed

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
            if sqlstate(exc) == "42501":
                raise self._driver_error(exc, "migrating") from None
            raise SchemaMismatch(
                f"migrating {self.target} failed and was rolled back, the schema is unchanged: "
                f"{message_of(exc)}",
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
                f"the COMMIT of the migration of {self.target} failed ({message_of(exc)}); open "
                "the store again: a migration either applied whole or not at all",
                applied=tuple(sorted(applied)),
                known=MIGRATIONS,
                running=running_version(),
            ) from None
