"""The SQLite store: schema versions, the operator open path, bad files, pragmas, driver errors."""

from __future__ import annotations

import os
import sqlite3
from datetime import timedelta

import pytest
from sqlalchemy.exc import OperationalError

from ctrlrun.effects.records import EffectState
from ctrlrun.errors import AmbiguousWrite, CTRLRunError, InvalidArgument, SchemaMismatch
from ctrlrun.receipt import UnreadableReceipt, verify_chain
from ctrlrun.store import SQLiteStateStore, open_store_url
from ctrlrun.store import sqlite as sqlite_module
from ctrlrun.store.schema import HEAD, MIGRATIONS, classify

from .test_store_conformance import granted_request, make_receipt, put_request


@pytest.fixture
def db(tmp_path):
    return tmp_path / "state.db"


def raw(path):
    return sqlite3.connect(path)


def tables(path) -> set[str]:
    with raw(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    return {r[0] for r in rows} - {"sqlite_sequence"}


# --------------------------------------------------------------------------- schema versioning


def test_fresh_store_records_its_migrations(db, clock):
    SQLiteStateStore(db, clock=clock).close()
    with raw(db) as conn:
        rows = conn.execute(
            "SELECT migration_id, applied_at, ctrlrun_version FROM schema_version ORDER BY migration_id"
        ).fetchall()
        head = conn.execute("SELECT id, seq, hash FROM receipt_chain").fetchall()
    assert tuple(r[0] for r in rows) == MIGRATIONS == (
        "0001_initial", "0002_approval_edits", "0003_authority", "0004_notifications",
        "0005_read_indexes",
        "0006_verified_mark", "0007_evidence", "0008_replayable_effects",
        "0009_effect_receipts_index",
    )  # fmt: skip
    assert rows[-1][0] == HEAD and all(r[1] and r[2] for r in rows)
    assert head == [(1, 0, "sha256:" + "0" * 64)]
    assert tables(db) == {
        "schema_version", "effects", "approvals", "events", "receipts", "receipt_chain",
        "delegations", "budget_ledger", "notifications", "verified_mark",
        "acts", "acts_chain", "acts_legacy", "prune_checkpoint", "holds", "anchors",
    }  # fmt: skip
    SQLiteStateStore(db, clock=clock).close()  # reopening at HEAD changes nothing
    with raw(db) as conn:
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone() == (len(MIGRATIONS),)


def test_classify_table():
    known = ("0001_initial", "0002_more")
    assert classify(False, {}, ()) == MIGRATIONS
    assert classify(True, {}, (), known) == known
    assert classify(True, {"0001_initial": "0.1"}, ("effects",), known) == ("0002_more",)
    assert classify(True, {m: "0.1" for m in known}, ("effects",), known) == ()
    with pytest.raises(SchemaMismatch) as newer:
        classify(True, {"0001_initial": "0.1", "0009_future": "9.9"}, ("effects",), known)
    assert "0009_future" in str(newer.value) and "9.9" in str(newer.value)
    assert newer.value.applied == ("0001_initial", "0009_future")
    assert newer.value.known == known
    with pytest.raises(SchemaMismatch, match="gap"):
        classify(True, {"0002_more": "0.1"}, ("effects",), known)
    with pytest.raises(SchemaMismatch):
        classify(True, {"0002_more": "0.1", "0003_x": "0.2"}, ("effects",), known)
    with pytest.raises(SchemaMismatch, match="no schema_version"):
        classify(False, {}, ("customers",), known)


def test_unknown_newer_migration_refused(db, clock):
    SQLiteStateStore(db, clock=clock).close()
    with raw(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES ('0009_future', 'x', '9.9.9')")
    for migrate in (True, False):
        with pytest.raises(SchemaMismatch, match="0009_future") as info:
            SQLiteStateStore(db, clock=clock, migrate=migrate)
        message = str(info.value)
        assert "9.9.9" in message and "upgrade ctrlrun" not in message  # a newer ctrlrun may not exist
        assert "written by another program or another version of ctrlrun" in message
        assert "Point ctrlrun at another path" in message and "the program that wrote it" in message
    default = str(SchemaMismatch(applied=("0009_future",), known=MIGRATIONS, running="0.1.0"))
    assert "upgrade ctrlrun" not in default and "another program or version" in default
    assert "0009_future" in default and "another path" in default


def test_foreign_database_refused_untouched(db, clock):
    with raw(db) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    before = db.read_bytes()
    with pytest.raises(SchemaMismatch):
        SQLiteStateStore(db, clock=clock)
    assert db.read_bytes() == before and tables(db) == {"customers"}


def test_failed_migration_rolls_back(db, clock):
    with raw(db) as conn:  # a version table with nothing applied, but a clashing table
        conn.execute(
            "CREATE TABLE schema_version (migration_id TEXT PRIMARY KEY, applied_at TEXT, "
            "ctrlrun_version TEXT)"
        )
        conn.execute("CREATE TABLE effects (x INTEGER)")
    with pytest.raises(SchemaMismatch, match="rolled back"):
        SQLiteStateStore(db, clock=clock)
    assert tables(db) == {"schema_version", "effects"}
    with raw(db) as conn:
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone() == (0,)


# --------------------------------------------------------------------------- operator open path


def test_migrate_false_never_creates(tmp_path, clock):
    missing = tmp_path / "nowhere" / "state.db"
    with pytest.raises(InvalidArgument, match="no ctrlrun store"):
        SQLiteStateStore(missing, clock=clock, migrate=False)
    assert not missing.parent.exists()
    with pytest.raises(InvalidArgument):
        open_store_url(f"sqlite://{missing}", migrate=False)
    assert not missing.parent.exists()


def test_migrate_false_refuses_unmigrated_file(db, clock, monkeypatch):
    from ctrlrun.store import sqlite

    monkeypatch.setattr(sqlite, "_EMPTY_WAIT", 0.0)
    db.write_bytes(b"")  # an empty file: never taken for a store, new or not
    with pytest.raises(InvalidArgument, match="empty file, not a ctrlrun store"):
        SQLiteStateStore(db, clock=clock, migrate=False)
    assert db.read_bytes() == b"" and sorted(os.listdir(db.parent)) == ["state.db"]


def test_migrate_false_opens_a_store_at_head(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    store.reserve_effect("k", "a1")
    store.close()
    operator = SQLiteStateStore(db, clock=clock, migrate=False)
    assert operator.get_effect("k").state is EffectState.RESERVED
    operator.close()


# --------------------------------------------------------------------------- bad paths and files


@pytest.mark.parametrize("content", [os.urandom(4096), b"hello, not a database\n" * 50])
@pytest.mark.parametrize("migrate", [True, False])
def test_corrupt_file_refused_clearly(db, clock, content, migrate):
    db.write_bytes(content)
    with pytest.raises(InvalidArgument) as info:
        SQLiteStateStore(db, clock=clock, migrate=migrate)
    assert str(db) in str(info.value) and "not a SQLite database" in str(info.value)
    assert db.read_bytes() == content


@pytest.mark.parametrize(
    "path",
    [":memory:", "", " ", "file::memory:?cache=shared", "file:x.db?mode=memory&cache=shared"],
)
def test_in_memory_paths_refused(path):
    with pytest.raises(InvalidArgument):
        SQLiteStateStore(path)


def test_bad_durability_and_path_type(db):
    with pytest.raises(InvalidArgument):
        SQLiteStateStore(db, durability="off")
    with pytest.raises(InvalidArgument):
        SQLiteStateStore(42)
    assert not db.exists()


def test_directory_as_path_refused(tmp_path):
    with pytest.raises(InvalidArgument, match=str(tmp_path)):
        SQLiteStateStore(tmp_path)


def test_parent_directory_created(tmp_path, clock):
    path = tmp_path / "a" / "b" / "state.db"
    store = SQLiteStateStore(str(path), clock=clock)
    assert store.path == path and path.is_file()
    store.close()


def test_old_sqlite_refused(db, monkeypatch):
    monkeypatch.setattr(sqlite_module.sqlite3, "sqlite_version_info", (3, 34, 1))
    with pytest.raises(InvalidArgument, match="3.35"):
        SQLiteStateStore(db)


# --------------------------------------------------------------------------- pragmas


@pytest.mark.parametrize("durability, level", [("full", 2), ("normal", 1)])
def test_durability_and_wal(db, clock, durability, level):
    store = SQLiteStateStore(db, clock=clock, durability=durability)
    conn = store._conn()
    assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == level
    assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    conn.rollback()
    store.close()
    with raw(db) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_open_restores_wal_but_operator_path_does_not(db, clock):
    SQLiteStateStore(db, clock=clock).close()
    with raw(db) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    SQLiteStateStore(db, clock=clock, migrate=False).close()
    with raw(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    SQLiteStateStore(db, clock=clock).close()
    with raw(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_default_durability_is_full(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    assert store.durability == "full"
    assert store._conn().exec_driver_sql("PRAGMA synchronous").scalar() == 2
    store.close()


# --------------------------------------------------------------------------- reopen


def test_reopen_keeps_everything(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    for key in ("amb", "com", "fai", "res"):
        store.reserve_effect(key, "a-" + key)
        store.begin_execution(key, "a-" + key)
    store.mark_ambiguous("amb", "a-amb", "TimeoutError: lost")
    store.commit_effect("com", "a-com", {"id": 7})
    store.fail_effect("fai", "a-fai", "declined")
    store.mark_ambiguous("res", "a-res", "lost")
    store.resolve_effect("res", EffectState.COMMITTED, "cli:local")
    request = granted_request(store, clock)
    placed = store.put_receipt(make_receipt())
    store.close()
    again = SQLiteStateStore(db, clock=clock)
    assert again.get_effect("amb").state is EffectState.AMBIGUOUS
    assert again.get_effect("com").result == {"id": 7}
    assert again.get_effect("fai").error == "declined"
    assert again.get_effect("res").resolved_by == "cli:local"
    assert again.get_approval(request.request_id).approver == "cli:local"
    assert again.chain_head() == (1, placed.hash)
    again.close()


def test_close_is_not_a_fence(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    store.close()
    store.reserve_effect("k", "a1")  # a later call opens a fresh connection
    assert store.get_effect("k") is not None
    store.close()


# --------------------------------------------------------------------------- damaged rows


def test_unreadable_receipt_is_returned_not_raised(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    placed = [store.put_receipt(make_receipt(n)) for n in range(3)]
    with raw(db) as conn:
        conn.execute("UPDATE receipts SET json = '{not json' WHERE seq = 2")
    rows = store.receipts()
    assert isinstance(rows[1], UnreadableReceipt)
    assert (rows[1].seq, rows[1].receipt_id, rows[1].hash) == (
        2,
        placed[1].receipt_id,
        placed[1].hash,
    )
    report = verify_chain(store)
    assert (report.breaks[0].name, report.breaks[0].seq) == ("content_altered", 2)
    store.close()


def test_missing_head_row(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    with raw(db) as conn:
        conn.execute("DELETE FROM receipt_chain")
    assert store.chain_head() is None
    with pytest.raises(InvalidArgument, match="head row is missing"):
        store.put_receipt(make_receipt())
    assert store.receipts() == ()
    store.close()


@pytest.mark.parametrize(
    "column, value", [("approvers", "{broken"), ("approvers", '{"a": 1}'),
                      ("approvers", '[{"agent": 5}]'), ("required_roles", "7"),
                      ("approvals_required", 0), ("action_json", "[]")],
)  # fmt: skip
def test_corrupted_authority_columns_fail_closed(db, clock, column, value):
    store = SQLiteStateStore(db, clock=clock)
    request = put_request(store, clock)
    with raw(db) as conn:
        conn.execute(f"UPDATE approvals SET {column} = ?", (value,))
    with pytest.raises(InvalidArgument, match=request.request_id):
        store.get_approval(request.request_id)
    with pytest.raises(InvalidArgument):
        store.grant_approval(request.request_id, "cli:local")
    store.close()


def test_null_threshold_reads_as_one(db, clock):
    store = SQLiteStateStore(db, clock=clock)
    request = put_request(store, clock)
    with raw(db) as conn:
        conn.execute("UPDATE approvals SET approvals_required = NULL")
    assert store.get_approval(request.request_id).request.approvals_required == 1
    store.close()


# --------------------------------------------------------------------------- driver errors


def test_busy_database_is_a_ctrlrun_error(db, clock, monkeypatch):
    SQLiteStateStore(db, clock=clock).close()
    monkeypatch.setattr(sqlite_module, "_BUSY_SECONDS", 0.05)
    store = SQLiteStateStore(db, clock=clock)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(CTRLRunError, match="busy"):
            store.reserve_effect("k", "a1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.reserve_effect("k", "a1")
    store.close()


def test_lost_commit_is_ambiguous_write(db, clock, monkeypatch):
    store = SQLiteStateStore(db, clock=clock)
    real_begin = store._begin_write

    class LostCommit:
        def __init__(self, transaction):
            self.transaction = transaction

        def __getattr__(self, name):  # run, committing, ...
            return getattr(self.transaction, name)

        def commit(self):
            self.rollback()
            raise sqlite3.OperationalError("disk I/O error")

        def rollback(self):
            self.transaction.rollback()

    monkeypatch.setattr(
        store, "_begin_write", lambda dbapi, cursor: LostCommit(real_begin(dbapi, cursor))
    )
    with pytest.raises(AmbiguousWrite, match="went unanswered"):
        store.reserve_effect("k", "a1")
    store.close()


def test_open_store_url(tmp_path, clock):
    store = open_store_url(f"sqlite://{tmp_path / 'u.db'}", clock=clock)
    assert isinstance(store, SQLiteStateStore) and store.path == tmp_path / "u.db"
    store.reserve_effect("k", "a", timedelta(seconds=1))
    store.close()
    for url in ("postgresql://u@127.0.0.1:1/db", "postgres://u@127.0.0.1:1/db"):
        with pytest.raises(CTRLRunError, match="Postgres store"):  # routed to PostgresStateStore
            open_store_url(url)
    for url in ("sqlite://", "mysql://x", "", "state.db", None):
        with pytest.raises(InvalidArgument):
            open_store_url(url)
