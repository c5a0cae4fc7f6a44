"""The Postgres store: construction and refusals, migrations, session hygiene, lost COMMITs,
and the default Control over ``CTRLRUN_STORE_URL`` (the rules themselves: the conformance suite).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import ctrlrun
from ctrlrun import Control, Policy, context, protect
from ctrlrun.approvals.records import ApprovalStatus
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import (
    AmbiguousWrite,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
    MissingDependency,
    SchemaMismatch,
)
from ctrlrun.postgres import PostgresStateStore, clock_skew, split_store_url
from ctrlrun.receipt import verify_chain
from ctrlrun.store import open_store_url
from ctrlrun.store.schema import MIGRATIONS

from .conftest import create_pg_schema, drop_pg_schema
from .test_store_conformance import granted_request, make_action, make_event, make_receipt
from .vectors import ROOT

SRC = Path(__file__).resolve().parents[1] / "src"


def admin(url: str, statement: str, *params):
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else None


def tables(url: str, schema: str) -> set[str]:
    rows = admin(url, "SELECT tablename FROM pg_tables WHERE schemaname = %s", schema)
    return {r[0] for r in rows}


def with_params(url: str, **params: str) -> str:
    joiner = "&" if "?" in url else "?"
    return url + joiner + "&".join(f"{k}={v}" for k, v in params.items())


@pytest.fixture
def pg(pg_url, pg_schema, clock):
    store = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    yield store
    store.close()


@pytest.fixture
def role(pg_url):
    """A login role with no rights on anything ctrlrun made (trust authentication)."""
    name = "ctrlrun_t_role_" + secrets.token_hex(4)
    admin(pg_url, f"CREATE ROLE {name} LOGIN")
    yield name
    admin(pg_url, f"DROP OWNED BY {name}")
    admin(pg_url, f"DROP ROLE {name}")


def as_role(url: str, role: str) -> str:
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = role
    return "postgresql://{user}@{host}:{port}/{dbname}".format(
        user=role,
        host=params.get("host", "127.0.0.1"),
        port=params.get("port", 5432),
        dbname=params.get("dbname", "postgres"),
    )


# --------------------------------------------------------------------------- no server needed


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_import_ctrlrun_never_imports_the_driver():
    done = _python(
        "import sys, ctrlrun; ctrlrun.Control; ctrlrun.protect; import ctrlrun.store; "
        "import ctrlrun.postgres, ctrlrun.store.postgres; "
        "assert ctrlrun.postgres.PostgresStateStore is ctrlrun.store.postgres.PostgresStateStore; "
        "assert 'psycopg' not in sys.modules, sorted(m for m in sys.modules if 'psycopg' in m)"
    )
    assert done.returncode == 0, done.stderr
    assert not hasattr(ctrlrun, "PostgresStateStore")  # not re-exported


def test_missing_driver_is_missing_dependency():
    done = _python(
        "import sys; sys.modules['psycopg'] = None\n"
        "from ctrlrun.errors import MissingDependency\n"
        "from ctrlrun.store import open_store_url\n"
        "try:\n"
        "    open_store_url('postgresql://u@127.0.0.1:1/db')\n"
        "except MissingDependency as exc:\n"
        "    print(exc.module, exc.extra, isinstance(exc, ImportError), exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("psycopg postgres True ")
    assert "pip install '.[postgres]' from the root of your ctrlrun clone" in done.stdout
    assert issubclass(MissingDependency, CTRLRunError)


def test_split_store_url():
    assert split_store_url("postgresql://u@h/db") == ("postgresql://u@h/db", None)
    assert split_store_url("postgres://u@h:5/db?ctrlrun_schema=ops") == (
        "postgres://u@h:5/db",
        "ops",
    )
    assert split_store_url(
        "postgresql://u:p%40ss@h1,h2/db?sslmode=require&ctrlrun_schema=ops&application_name=a"
    ) == ("postgresql://u:p%40ss@h1,h2/db?sslmode=require&application_name=a", "ops")
    for bad in (
        "postgresql://h/db?ctrlrun_schema=",
        "postgresql://h/db?ctrlrun_schema=a&ctrlrun_schema=b",
        "mysql://h/db",
        None,
    ):
        with pytest.raises(InvalidArgument):
            split_store_url(bad)


@pytest.mark.parametrize("schema", ["", "a b", "x;drop", '"q"', "9lives", "a" * 64, 7, None])
def test_bad_schema_names_refused_before_connecting(schema):
    with pytest.raises(InvalidArgument, match="schema"):
        PostgresStateStore("postgresql://u@127.0.0.1:1/db", schema=schema)
    if isinstance(schema, str):
        with pytest.raises(InvalidArgument):
            open_store_url(f"postgresql://u@127.0.0.1:1/db?ctrlrun_schema={schema}")


def test_schema_given_twice_must_agree():
    with pytest.raises(InvalidArgument, match="give one"):
        PostgresStateStore("postgresql://u@127.0.0.1:1/db?ctrlrun_schema=a", schema="b")


def test_unreachable_server_is_a_ctrlrun_error():
    with pytest.raises(CTRLRunError, match="cannot reach") as info:
        PostgresStateStore("postgresql://nobody:secret@127.0.0.1:1/db?connect_timeout=2")
    assert "secret" not in str(info.value)  # the password is never echoed


def test_clock_skew():
    now = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
    assert clock_skew(now, now + timedelta(seconds=0.9), 0.0) is None
    assert clock_skew(now, now - timedelta(seconds=1.5), 0.2) == timedelta(seconds=1.3)
    assert clock_skew(now, now + timedelta(seconds=1.5), 1.0) is None  # within the round trip
    assert clock_skew(now, None, 0.0) is None


# --------------------------------------------------------------------------- opening


needs_server = pytest.mark.postgres


@needs_server
def test_fresh_schema_is_migrated_and_recorded(pg_url, pg_schema, clock):
    PostgresStateStore(pg_url, schema=pg_schema, clock=clock).close()
    assert tables(pg_url, pg_schema) == {
        "schema_version", "effects", "approvals", "events", "receipts", "receipt_chain",
        "delegations", "budget_ledger", "notifications", "verified_mark",
        "acts", "acts_chain", "acts_legacy", "prune_checkpoint", "holds", "anchors",
    }  # fmt: skip
    rows = admin(pg_url, f"SELECT migration_id, ctrlrun_version FROM {pg_schema}.schema_version")
    assert tuple(sorted(r[0] for r in rows)) == MIGRATIONS and rows[0][1]
    assert admin(pg_url, f"SELECT id, seq, hash FROM {pg_schema}.receipt_chain") == [
        (1, 0, "sha256:" + "0" * 64)
    ]
    PostgresStateStore(pg_url, schema=pg_schema, clock=clock).close()  # at HEAD: nothing to do
    assert len(admin(pg_url, f"SELECT * FROM {pg_schema}.schema_version")) == len(MIGRATIONS)


@needs_server
def test_open_store_url_strips_the_schema_parameter(pg_url, pg_schema, clock):
    for scheme in ("postgresql://", "postgres://"):
        url = scheme + pg_url.split("://", 1)[1]
        store = open_store_url(
            with_params(url, ctrlrun_schema=pg_schema, application_name="ctrlrun_t"), clock=clock
        )
        assert isinstance(store, PostgresStateStore) and store.schema == pg_schema
        assert "ctrlrun_schema" not in store._conninfo and "application_name" in store._conninfo
        store.reserve_effect(f"k{scheme}", "a1")
        store.close()
    assert "effects" not in tables(pg_url, "public")
    driver_url = pg_url.replace("postgresql://", "postgresql+psycopg://")
    store = PostgresStateStore(with_params(driver_url, ctrlrun_schema=pg_schema))
    assert len(store.list_effects()) == 2
    store.close()


@needs_server
def test_missing_schema_refused_and_not_created(pg_url):
    name = "ctrlrun_t_missing_" + secrets.token_hex(4)
    for migrate in (True, False):
        with pytest.raises(InvalidArgument, match=f"{name}.*does not exist.*CREATE SCHEMA"):
            PostgresStateStore(pg_url, schema=name, migrate=migrate)
    assert admin(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", name) == []


@needs_server
def test_schema_without_create_refused_naming_the_grant(pg_url, pg_schema, role):
    admin(pg_url, f"GRANT USAGE ON SCHEMA {pg_schema} TO {role}")
    with pytest.raises(InvalidArgument, match=f"GRANT CREATE ON SCHEMA \"{pg_schema}\""):
        PostgresStateStore(as_role(pg_url, role), schema=pg_schema)
    assert tables(pg_url, pg_schema) == set()
    admin(pg_url, f"REVOKE USAGE ON SCHEMA {pg_schema} FROM {role}")
    with pytest.raises(InvalidArgument, match="GRANT USAGE, CREATE"):
        PostgresStateStore(as_role(pg_url, role), schema=pg_schema)


@needs_server
def test_operator_role_without_create_may_open_a_migrated_store(pg_url, pg_schema, role):
    PostgresStateStore(pg_url, schema=pg_schema).close()
    admin(pg_url, f"GRANT USAGE ON SCHEMA {pg_schema} TO {role}")
    with pytest.raises(InvalidArgument, match="permission denied.*GRANT"):  # no table rights
        PostgresStateStore(as_role(pg_url, role), schema=pg_schema, migrate=False)
    admin(pg_url, f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {pg_schema} TO {role}")
    store = PostgresStateStore(as_role(pg_url, role), schema=pg_schema, migrate=False)
    store.reserve_effect("k", "a1")
    assert store.get_effect("k").state is EffectState.RESERVED
    store.close()


@needs_server
def test_non_utf8_database_refused(pg_url):
    name = "ctrlrun_t_db_" + secrets.token_hex(4)
    admin(
        pg_url,
        f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0 "
        "LC_COLLATE 'C' LC_CTYPE 'C'",
    )
    try:
        url = pg_url.rsplit("/", 1)[0] + "/" + name
        with pytest.raises(InvalidArgument, match="SQL_ASCII, not UTF8"):
            PostgresStateStore(url)
        assert tables(url, "public") == set()
    finally:
        admin(pg_url, f"DROP DATABASE {name} WITH (FORCE)")


@needs_server
def test_newer_schema_refused(pg_url, pg_schema):
    PostgresStateStore(pg_url, schema=pg_schema).close()
    admin(pg_url, f"INSERT INTO {pg_schema}.schema_version VALUES ('0009_future', 'x', '9.9.9')")
    for migrate in (True, False):
        with pytest.raises(SchemaMismatch, match="0009_future.*9.9.9") as info:
            PostgresStateStore(pg_url, schema=pg_schema, migrate=migrate)
        assert info.value.applied == (*MIGRATIONS, "0009_future")


@needs_server
def test_foreign_tables_refused_untouched(pg_url, pg_schema):
    admin(pg_url, f"CREATE TABLE {pg_schema}.customers (id int)")
    with pytest.raises(SchemaMismatch, match="no schema_version"):
        PostgresStateStore(pg_url, schema=pg_schema)
    assert tables(pg_url, pg_schema) == {"customers"}


@needs_server
def test_failed_migration_rolls_back(pg_url, pg_schema):
    # A version table with nothing recorded plus a clashing table: 0001 runs and fails.
    admin(
        pg_url,
        f"CREATE TABLE {pg_schema}.schema_version "
        "(migration_id text primary key, applied_at text, ctrlrun_version text)",
    )
    admin(pg_url, f"CREATE TABLE {pg_schema}.receipts (x int)")
    with pytest.raises(SchemaMismatch, match="rolled back"):
        PostgresStateStore(pg_url, schema=pg_schema)
    assert tables(pg_url, pg_schema) == {"schema_version", "receipts"}
    assert admin(pg_url, f"SELECT * FROM {pg_schema}.schema_version") == []


@needs_server
def test_migrate_false_creates_nothing(pg_url, pg_schema):
    with pytest.raises(InvalidArgument, match="never creates or upgrades"):
        PostgresStateStore(pg_url, schema=pg_schema, migrate=False)
    with pytest.raises(InvalidArgument, match="never creates or upgrades"):
        open_store_url(with_params(pg_url, ctrlrun_schema=pg_schema), migrate=False)
    assert tables(pg_url, pg_schema) == set()


@needs_server
def test_concurrent_opens_of_a_fresh_schema_all_succeed(pg_url, pg_schema):
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        barrier.wait(timeout=30)
        try:
            PostgresStateStore(pg_url, schema=pg_schema).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(admin(pg_url, f"SELECT * FROM {pg_schema}.schema_version")) == len(MIGRATIONS)


# --------------------------------------------------------------------------- the tables


@needs_server
def test_identity_columns_compare_bytewise(pg_url, pg, pg_schema):
    rows = admin(
        pg_url,
        "SELECT table_name, column_name, collation_name FROM information_schema.columns "
        "WHERE table_schema = %s AND data_type = 'text'",
        pg_schema,
    )
    collations = {(t, c): coll for t, c, coll in rows}
    for column in [("effects", "effect_key"), ("effects", "action_id"),
                   ("approvals", "approval_id"), ("approvals", "action_hash"),
                   ("receipts", "receipt_id"), ("effects", "created_at"),
                   ("approvals", "expires_at")]:  # fmt: skip
        assert collations[column] == "C", column
    for key in ("b", "B", "a", "é", "e\u0301", "Z"):
        pg.reserve_effect(key, "a1")
    ordered = [r.effect_key for r in pg.list_effects()]  # same created_at: by key, bytewise
    assert ordered == sorted(ordered) and len(set(ordered)) == 6  # é and e+U+0301 stay two keys


@needs_server
def test_every_statement_names_its_schema(pg_url, pg_schema, clock):
    url = with_params(pg_url, options="-csearch_path%3Dnowhere")  # no schema on the path
    store = PostgresStateStore(url, schema=pg_schema, clock=clock)
    store.reserve_effect("k", "a1")
    store.put_receipt(make_receipt())
    assert store.get_effect("k").attempt == 1 and store.chain_head()[0] == 1
    store.close()
    assert not tables(pg_url, "public") & {"effects", "receipts", "schema_version"}


@needs_server
def test_connections_never_idle_in_a_transaction(pg_url, pg):
    pg.reserve_effect("k", "a1")
    pg.get_effect("k")
    pg.list_effects()
    pid = pg._conn().connection.dbapi_connection.info.backend_pid
    ((state, autocommit_ok),) = admin(
        pg_url, "SELECT state, backend_xid IS NULL FROM pg_stat_activity WHERE pid = %s", pid
    )
    assert state == "idle" and autocommit_ok
    pg.close()
    assert admin(pg_url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid) in ([], None)


@needs_server
def test_stale_writer_under_read_committed(pg_url, pg_schema, clock):
    """C4 across connections: a write that read before another committed changes nothing."""
    first = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    second = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    try:
        first.reserve_effect("k", "a1")

        def interleaved(tx, now):
            stale = tx.effect("k")
            second.begin_execution("k", "a1")  # commits on its own connection meanwhile
            return tx.update_effect(stale, replace(stale, action_id="thief"))

        assert first._write(interleaved) is False
        assert first.get_effect("k").state is EffectState.EXECUTING
        assert first.get_effect("k").action_id == "a1"
    finally:
        first.close()
        second.close()


@needs_server
def test_approval_refusal_wins_a_race_on_the_key(pg_url, pg_schema, clock, monkeypatch):
    """Two presenters of one approval and one key: the loser hears about the approval."""
    from ctrlrun.store import sql

    first = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    second = PostgresStateStore(pg_url, schema=pg_schema, clock=clock)
    try:
        action = make_action()
        request = granted_request(first, clock, action)
        raced: list[str] = []

        class Racing(sql.SQLTx):
            def effect(self, effect_key):
                record = super().effect(effect_key)
                if not raced:  # the other presenter wins while this one looks at the key
                    raced.append(effect_key)
                    second.consume_approval_and_reserve(
                        request.request_id, action.action_hash, "k", "other"
                    )
                return record

        monkeypatch.setattr(sql, "SQLTx", Racing)
        with pytest.raises(ApprovalMismatch) as info:
            first.consume_approval_and_reserve(request.request_id, action.action_hash, "k", "mine")
        assert raced == ["k"] and info.value.reason == "consumed"
        assert first.get_effect("k").action_id == "other"
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------------------- lost COMMIT


class FaultyCommit:
    """Wraps one write transaction so its COMMIT fails in a chosen way."""

    def __init__(self, store, dbapi, cursor, how: str, url: str) -> None:
        self.transaction = PostgresStateStore._begin_write(store, dbapi, cursor)
        self.how, self.url = how, url

    def __getattr__(self, name):  # run, run_and_commit, committing, fused, ...
        return getattr(self.transaction, name)

    def commit(self) -> None:
        import psycopg

        if self.how == "reply_lost":  # committed, but the answer never arrived
            self.transaction.commit()
            raise psycopg.OperationalError("server closed the connection")
        if self.how == "terminated":  # the server goes away right before COMMIT
            pid = self.transaction.dbapi.info.backend_pid
            admin(self.url, "SELECT pg_terminate_backend(%s)", pid)
            self.transaction.commit()
            raise AssertionError("COMMIT on a terminated connection succeeded")
        if self.how in ("serialization", "deadlock"):
            self.transaction.rollback()
            error = {
                "serialization": psycopg.errors.SerializationFailure,
                "deadlock": psycopg.errors.DeadlockDetected,
            }[self.how]
            raise error("could not serialize")
        raise AssertionError(self.how)

    def rollback(self) -> None:
        self.transaction.rollback()


def fail_next_commit(monkeypatch, store, how: str, url: str) -> list[int]:
    """Make the next write's COMMIT fail; later writes are normal again."""
    used: list[int] = []

    def begin(dbapi, cursor):
        if used:
            return PostgresStateStore._begin_write(store, dbapi, cursor)
        used.append(1)
        return FaultyCommit(store, dbapi, cursor, how, url)

    monkeypatch.setattr(store, "_begin_write", begin)
    return used


@needs_server
@pytest.mark.parametrize("how", ["reply_lost", "terminated"])
def test_lost_commit_is_ambiguous_write(pg_url, pg, monkeypatch, how):
    fail_next_commit(monkeypatch, pg, how, pg_url)
    with pytest.raises(AmbiguousWrite, match="went unanswered"):
        pg.reserve_effect("k", "a1")
    record = pg.get_effect("k")  # the store carries on (a fresh connection if it lost one)
    if how == "reply_lost":
        assert record.state is EffectState.RESERVED  # it did commit: the lease settles it
        with pytest.raises(DuplicateEffect):
            pg.reserve_effect("k", "a2")
    else:
        assert record is None  # it did not
        assert pg.reserve_effect("k", "a2").attempt == 1


@needs_server
@pytest.mark.parametrize("how", ["serialization", "deadlock"])
def test_commit_rolled_back_by_the_server_is_not_ambiguous(pg_url, pg, monkeypatch, how):
    fail_next_commit(monkeypatch, pg, how, pg_url)
    with pytest.raises(CTRLRunError, match="nothing was written") as info:
        pg.reserve_effect("k", "a1")
    assert not isinstance(info.value, AmbiguousWrite)
    assert pg.get_effect("k") is None


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


@needs_server
@pytest.mark.parametrize("how", ["reply_lost", "never_sent"])
def test_a_lost_start_commit_never_runs_the_function_and_leaves_a_retry_that_runs_once(
    pg_url, pg, clock, monkeypatch, how
):
    calls: list[str] = []
    control = Control(Policy.from_yaml(POLICY), pg, clock=clock)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        calls.append(payment_id)
        return "ok"

    if how == "reply_lost":  # the start committed, its answer never came
        fail_next_commit(monkeypatch, pg, "reply_lost", pg_url)
        said = "now released"
    else:  # the start never reached the server
        real = pg._try_write

        def lost_before(operation):
            monkeypatch.setattr(pg, "_try_write", real)
            import psycopg

            from ctrlrun.store.sql import _Failed

            cause = psycopg.OperationalError("server closed the connection")
            raise _Failed(cause, pg._commit_error(cause), unknown=True)

        monkeypatch.setattr(pg, "_try_write", lost_before)
        said = "kept nothing"
    with context(agent="agent-1"):
        with pytest.raises(AmbiguousWrite, match=said) as info:
            refund(payment_id="txn_1", amount=100)
        assert "the function was not run" in str(info.value) and calls == []
        record = pg.get_effect("refund:txn_1")
        if how == "reply_lost":  # released, with its receipt: it provably never ran
            assert record.state is EffectState.FAILED
            (receipt,) = pg.receipts()
            assert receipt.result == "failed" and "was not run" in receipt.error
        else:
            assert record is None and pg.receipts() == ()
        assert refund(payment_id="txn_1", amount=100) == "ok"  # the same code's retry
        assert calls == ["txn_1"]  # exactly once
        assert pg.get_effect("refund:txn_1").state is EffectState.COMMITTED
        assert verify_chain(pg).ok


# --------------------------------------------------------------------------- BEGIN and COMMIT sent with statements


def spy_messages(monkeypatch, store, fault=None) -> list[str]:
    """Record every message the store's data path sends; ``fault(cursor, message, params)`` may
    stand in for sending one on the real cursor."""
    messages: list[str] = []
    real = store._cursor

    def spying(dbapi):
        cursor = real(dbapi)

        class Spy:
            def __getattr__(self, name):
                return getattr(cursor, name)

            def execute(self, query, params=None):
                messages.append(query)
                if fault is not None:
                    return fault(cursor, query, params)
                return cursor.execute(query, params)

        return Spy()

    monkeypatch.setattr(store, "_cursor", spying)
    store._local.driver = None  # the next write takes a cursor from _cursor
    return messages


@needs_server
def test_allowed_call_is_two_messages(pg, clock, monkeypatch):
    """BEGIN goes with the first statement and COMMIT with the last: the start is one message,
    and so is the finish (the server places the receipt after the head it locks, hashing the
    draft's pieces itself), so no lock outlives a message."""
    control = Control(Policy.from_yaml(POLICY), pg, clock=clock)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        return "ok"

    with context(agent="agent-1"):
        refund(payment_id="warm", amount=100)
        messages = spy_messages(monkeypatch, pg)
        before = pg.transactions
        assert refund(payment_id="txn_1", amount=100) == "ok"
    assert pg.transactions - before == 2
    assert [(m.split(" AS ")[0], m.endswith("; COMMIT")) for m in messages] == [
        ("BEGIN; WITH reserved", True),
        ("BEGIN; WITH finished", True),
    ]
    assert pg.get_effect("refund:txn_1").state is EffectState.COMMITTED
    assert verify_chain(pg).ok


@needs_server
def test_start_on_a_taken_key_goes_on_in_a_new_transaction(pg, monkeypatch):
    """The combined insert finds the key taken, writes nothing and commits; the refusal is then
    decided from the stored record, in a transaction of its own."""
    pg.start_attempt(action_id="a1", effect_key="k", lease=timedelta(minutes=5))
    messages = spy_messages(monkeypatch, pg)
    with pytest.raises(DuplicateEffect):
        pg.start_attempt(
            action_id="a2", effect_key="k", lease=timedelta(minutes=5),
            events=lambda approval, reservation: [make_event()],
        )  # fmt: skip
    assert messages[0].startswith("BEGIN; WITH reserved") and messages[0].endswith("; COMMIT")
    assert messages[1].startswith("BEGIN; SELECT")
    assert pg.get_effect("k").action_id == "a1" and pg.events() == ()


@needs_server
@pytest.mark.parametrize("when", ["after", "before"])
def test_lost_reply_to_a_message_carrying_commit_is_ambiguous(pg, monkeypatch, when):
    import psycopg

    def lose(cursor, message, params):
        if message.endswith("; COMMIT"):
            if when == "after":
                cursor.execute(message, params)  # carried out; only the answer is lost
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursor.execute(message, params)

    spy_messages(monkeypatch, pg, lose)
    with pytest.raises(AmbiguousWrite, match="went unanswered"):
        pg.start_attempt(
            action_id="a1", effect_key="k", lease=timedelta(minutes=5),
            events=lambda approval, reservation: [make_event()],
        )  # fmt: skip
    monkeypatch.undo()
    record = pg.get_effect("k")
    if when == "after":
        assert record.state is EffectState.EXECUTING and len(pg.events()) == 1
    else:
        assert record is None and pg.events() == ()


@needs_server
def test_statement_failing_before_the_commit_it_carries_is_not_ambiguous(pg, monkeypatch):
    def fail(cursor, message, params):
        if message.startswith("BEGIN; WITH reserved"):  # the statement fails, COMMIT never runs
            return cursor.execute("BEGIN; SELECT 1/0; COMMIT")
        return cursor.execute(message, params)

    spy_messages(monkeypatch, pg, fail)
    with pytest.raises(CTRLRunError, match="while writing") as info:
        pg.start_attempt(
            action_id="a1", effect_key="k", lease=timedelta(minutes=5),
            events=lambda approval, reservation: [make_event()],
        )  # fmt: skip
    assert not isinstance(info.value, AmbiguousWrite)
    monkeypatch.undo()
    assert pg.get_effect("k") is None
    assert pg.start_attempt(action_id="a2", effect_key="k", lease=timedelta(minutes=5))[1]


@needs_server
def test_a_write_that_starts_with_an_approval_keeps_it_in_the_transaction(pg, clock, monkeypatch):
    """An approval consumed without a key: BEGIN travels with the first statement like every
    other, so when the events' insert fails the consumption is rolled back with it."""
    action = make_action()
    request = granted_request(pg, clock, action)

    def fail(cursor, message, params):
        if "INSERT INTO" in message and ".events" in message:
            return cursor.execute("SELECT 1/0")
        return cursor.execute(message, params)

    messages = spy_messages(monkeypatch, pg, fail)
    with pytest.raises(CTRLRunError, match="while writing"):
        pg.start_attempt(
            action_id=action.action_id, effect_key=None, approval_id=request.request_id,
            action_hash=action.action_hash, events=lambda approval, reservation: [make_event()],
        )  # fmt: skip
    assert messages[0].startswith("BEGIN; SELECT")
    monkeypatch.undo()
    assert pg.get_approval(request.request_id).status is ApprovalStatus.GRANTED
    assert pg.events() == ()


# --------------------------------------------------------------------------- the default Control


@needs_server
def test_default_control_uses_ctrlrun_store_url(pg_url, pg_schema, tmp_path, monkeypatch):
    for name in ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    shutil.copy(ROOT / "ctrlrun.yaml", tmp_path / "ctrlrun.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CTRLRUN_STORE_URL", with_params(pg_url, ctrlrun_schema=pg_schema))
    ctrlrun.reset()
    try:

        @ctrlrun.protect("customer.read")
        def read(customer_id: str) -> str:
            return customer_id

        with ctrlrun.context(agent="a"):
            assert read("c1") == "c1"
        control = ctrlrun.control.default.default_control()
        assert isinstance(control.store, PostgresStateStore)
        assert control.store.schema == pg_schema and control.sinks == ()  # no JSONL copy
        assert [r.result for r in control.store.receipts()] == ["committed"]
        assert not (tmp_path / ".ctrlrun").exists()
    finally:
        ctrlrun.reset()


@needs_server
def test_schema_dropped_under_a_running_store_is_a_ctrlrun_error(pg_url, clock):
    schema = create_pg_schema(pg_url)
    store = PostgresStateStore(pg_url, schema=schema, clock=clock)
    drop_pg_schema(pg_url, schema)
    with pytest.raises(CTRLRunError, match="Postgres store"):
        store.reserve_effect("k", "a1")
    with pytest.raises(CTRLRunError):
        store.get_effect("k")
    store.close()


@needs_server
def test_the_server_places_receipts_byte_for_byte(pg, clock):
    """Receipts the server wrote from a draft's pieces read back as the same line and hash as
    ``Receipt`` computes, for any text in them; the chain verifies."""
    import json as _json

    from ctrlrun.evidence.receipt import Receipt

    control = Control(Policy.from_yaml(POLICY), pg, clock=clock)

    @protect("stripe.refund", control=control, task="t-{payment_id}")
    def refund(payment_id: str, amount: int, note: object = None) -> str:
        return "ok"

    notes = [None, "ü € 😀", {"b": [1, "\u2028", True], "a": {"z": None}}, "'; --", 'q"%s%%']
    with context(agent="agent-ü", user="o'brien"):
        for i, note in enumerate(notes):
            assert refund(payment_id=f"p{i}\t", amount=100, note=note) == "ok"
    stored = pg.receipts()
    assert len(stored) == len(notes) and verify_chain(pg).ok
    for receipt in stored:
        rebuilt, _ = Receipt.from_dict(receipt.to_dict())._placed(receipt.seq, receipt.prev_hash)
        assert rebuilt.to_json() == receipt.to_json() and rebuilt.hash == receipt.hash
    assert [_json.loads(r.to_json())["arguments"]["note"] for r in stored] == notes


@needs_server
def test_a_taken_receipt_id_in_the_one_message_finish_writes_none_of_it(pg, clock, monkeypatch):
    import ctrlrun.control.straight as straight

    control = Control(Policy.from_yaml(POLICY), pg, clock=clock)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        return "ok"

    monkeypatch.setattr(straight, "new_id", lambda prefix: f"{prefix}_fixed")
    with context(agent="agent-1"):
        refund(payment_id="txn_1", amount=100)
        head = pg.chain_head()
        with pytest.raises(InvalidArgument, match="already stored"):
            refund(payment_id="txn_2", amount=100)
    record = pg.get_effect("refund:txn_2")
    assert record.state is EffectState.EXECUTING  # the finish wrote nothing of itself
    assert [r.result for r in pg.receipts()] == ["committed", "ambiguous"]
    assert pg.chain_head()[0] == head[0] + 1 and verify_chain(pg).ok
