"""One ``MetaData``, one migration list: the generated DDL builds the database the hand-written DDL
of earlier builds built, on SQLite and on Postgres, and a store made by that DDL keeps working.

The hand-written DDL lives here only, as the reference the generated schema is held to.
"""

from __future__ import annotations

import re
import secrets
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import psycopg as pg_driver
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex

from ctrlrun.authority.ledger import Charge, DelegationRecord
from ctrlrun.effects.records import EffectState
from ctrlrun.errors import BudgetExhausted
from ctrlrun.receipt import GENESIS_HASH, EventType, verify_chain
from ctrlrun.store import SQLiteStateStore, StateStore
from ctrlrun.store import schema as schema_module
from ctrlrun.store.schema import (
    HEAD,
    MIGRATIONS,
    SCHEMA_MIGRATIONS,
    AddColumn,
    metadata,
    migration_sql,
    schema_version,
)

from .conftest import create_pg_schema, drop_pg_schema
from .test_store_conformance import LEASE, granted_request, make_event, make_receipt

# --------------------------------------------------------------------------- the reference DDL

OLD_SCHEMA_VERSION = {
    "sqlite": (
        "CREATE TABLE schema_version (migration_id TEXT PRIMARY KEY, "
        "applied_at TEXT NOT NULL, ctrlrun_version TEXT NOT NULL)"
    ),
    "postgresql": (
        'CREATE TABLE {s}.schema_version (migration_id TEXT COLLATE "C" PRIMARY KEY, '
        'applied_at TEXT COLLATE "C" NOT NULL, ctrlrun_version TEXT COLLATE "C" NOT NULL)'
    ),
}

OLD_0001_SQLITE = (
    """CREATE TABLE effects (
        effect_key TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        action_id TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        lease_expires_at TEXT,
        result_json TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        resolved_by TEXT)""",
    "CREATE INDEX effects_state ON effects (state)",
    """CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        action_hash TEXT NOT NULL,
        status TEXT NOT NULL,
        action_json TEXT NOT NULL,
        approver TEXT,
        created_at TEXT NOT NULL,
        granted_at TEXT,
        expires_at TEXT NOT NULL,
        consumed_at TEXT,
        policy_hash_at_approval TEXT,
        precondition_fingerprint TEXT,
        approvers TEXT NOT NULL DEFAULT '[]',
        required_roles TEXT NOT NULL DEFAULT '[]',
        approvals_required INTEGER)""",
    "CREATE INDEX approvals_action_hash ON approvals (action_hash)",
    "CREATE INDEX approvals_status_expires ON approvals (status, expires_at)",
    """CREATE TABLE events (
        event_id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts TEXT NOT NULL,
        type TEXT NOT NULL,
        action_id TEXT,
        effect_key TEXT,
        approval_id TEXT,
        data_json TEXT NOT NULL)""",
    """CREATE TABLE receipts (
        receipt_id TEXT PRIMARY KEY,
        action_id TEXT,
        effect_key TEXT,
        result TEXT,
        json TEXT,
        ts TEXT,
        seq INTEGER UNIQUE,
        prev_hash TEXT,
        hash TEXT)""",
    """CREATE TABLE receipt_chain (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        hash TEXT NOT NULL)""",
    f"INSERT INTO receipt_chain (id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}')",
)

_C = 'TEXT COLLATE "C"'

OLD_0001_POSTGRESQL = (
    f"""CREATE TABLE {{s}}.effects (
        effect_key {_C} PRIMARY KEY,
        state {_C} NOT NULL,
        action_id {_C} NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        lease_expires_at {_C},
        result_json TEXT,
        error TEXT,
        created_at {_C} NOT NULL,
        updated_at {_C} NOT NULL,
        resolved_by {_C})""",
    "CREATE INDEX effects_state ON {s}.effects (state)",
    f"""CREATE TABLE {{s}}.approvals (
        approval_id {_C} PRIMARY KEY,
        action_hash {_C} NOT NULL,
        status {_C} NOT NULL,
        action_json TEXT NOT NULL,
        approver {_C},
        created_at {_C} NOT NULL,
        granted_at {_C},
        expires_at {_C} NOT NULL,
        consumed_at {_C},
        policy_hash_at_approval {_C},
        precondition_fingerprint {_C},
        approvers {_C} NOT NULL DEFAULT '[]',
        required_roles TEXT NOT NULL DEFAULT '[]',
        approvals_required INTEGER)""",
    "CREATE INDEX approvals_action_hash ON {s}.approvals (action_hash)",
    "CREATE INDEX approvals_status_expires ON {s}.approvals (status, expires_at)",
    f"""CREATE TABLE {{s}}.events (
        event_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts {_C} NOT NULL,
        type {_C} NOT NULL,
        action_id {_C},
        effect_key {_C},
        approval_id {_C},
        data_json TEXT NOT NULL)""",
    f"""CREATE TABLE {{s}}.receipts (
        receipt_id {_C} PRIMARY KEY,
        action_id {_C},
        effect_key {_C},
        result {_C},
        json TEXT,
        ts {_C},
        seq BIGINT UNIQUE,
        prev_hash {_C},
        hash {_C})""",
    f"""CREATE TABLE {{s}}.receipt_chain (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash {_C} NOT NULL)""",
    f"INSERT INTO {{s}}.receipt_chain (id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}')",
)

OLD_0003_SQLITE = (
    """CREATE TABLE delegations (
        delegation_id TEXT PRIMARY KEY,
        parent_id TEXT NOT NULL,
        depth INTEGER NOT NULL,
        grant_json TEXT NOT NULL,
        created_by_agent TEXT NOT NULL,
        created_by_user TEXT,
        created_via TEXT NOT NULL,
        created_at TEXT NOT NULL,
        revoked_at TEXT,
        revoked_by TEXT)""",
    "CREATE INDEX delegations_parent ON delegations (parent_id)",
    """CREATE TABLE budget_ledger (
        id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        grant_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        amount BIGINT NOT NULL,
        effect_key TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        consumed_at TEXT NOT NULL,
        released_at TEXT,
        CONSTRAINT budget_ledger_charge UNIQUE (effect_key, attempt, grant_id, metric))""",
    "CREATE INDEX budget_ledger_window ON budget_ledger (grant_id, metric, consumed_at)",
)

OLD_0003_POSTGRESQL = (
    f"""CREATE TABLE {{s}}.delegations (
        delegation_id {_C} PRIMARY KEY,
        parent_id {_C} NOT NULL,
        depth INTEGER NOT NULL,
        grant_json TEXT NOT NULL,
        created_by_agent {_C} NOT NULL,
        created_by_user {_C},
        created_via {_C} NOT NULL,
        created_at {_C} NOT NULL,
        revoked_at {_C},
        revoked_by {_C})""",
    "CREATE INDEX delegations_parent ON {s}.delegations (parent_id)",
    f"""CREATE TABLE {{s}}.budget_ledger (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        grant_id {_C} NOT NULL,
        metric {_C} NOT NULL,
        amount BIGINT NOT NULL,
        effect_key {_C} NOT NULL,
        attempt INTEGER NOT NULL,
        consumed_at {_C} NOT NULL,
        released_at {_C},
        CONSTRAINT budget_ledger_charge UNIQUE (effect_key, attempt, grant_id, metric))""",
    "CREATE INDEX budget_ledger_window ON {s}.budget_ledger (grant_id, metric, consumed_at)",
)

OLD_0004_SQLITE = (
    """CREATE TABLE notifications (
        delivery_id TEXT PRIMARY KEY,
        subject_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_status TEXT,
        last_attempt_at TEXT,
        next_attempt_at TEXT,
        delivered_at TEXT,
        CONSTRAINT notifications_claim UNIQUE (subject_id, kind, target))""",
    "CREATE INDEX notifications_due ON notifications (next_attempt_at)",
)

OLD_0004_POSTGRESQL = (
    f"""CREATE TABLE {{s}}.notifications (
        delivery_id {_C} PRIMARY KEY,
        subject_id {_C} NOT NULL,
        kind {_C} NOT NULL,
        target {_C} NOT NULL,
        body TEXT NOT NULL,
        created_at {_C} NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_status TEXT,
        last_attempt_at {_C},
        next_attempt_at {_C},
        delivered_at {_C},
        CONSTRAINT notifications_claim UNIQUE (subject_id, kind, target))""",
    "CREATE INDEX notifications_due ON {s}.notifications (next_attempt_at)",
)

OLD_0005_SQLITE = (
    "CREATE INDEX effects_created ON effects (created_at, effect_key)",
    "CREATE INDEX receipts_action_id ON receipts (action_id)",
    "CREATE INDEX receipts_effect_key ON receipts (effect_key)",
    "ALTER TABLE receipts ADD COLUMN approval_id TEXT",
    "CREATE INDEX receipts_approval_id ON receipts (approval_id) WHERE approval_id IS NOT NULL",
    "UPDATE receipts SET approval_id = CASE WHEN json_valid(json) THEN CASE WHEN "
    "json_type(json, '$.approval_id') = 'text' THEN json_extract(json, '$.approval_id') "
    "END END WHERE approval_id IS NULL AND instr(json, '\"approval_id\":\"') > 0",
    "CREATE INDEX events_action_id ON events (action_id)",
    "CREATE INDEX events_approval_id ON events (approval_id) WHERE approval_id IS NOT NULL",
)

OLD_0005_POSTGRESQL = (
    "CREATE INDEX effects_created ON {s}.effects (created_at, effect_key)",
    "CREATE INDEX receipts_action_id ON {s}.receipts (action_id)",
    "CREATE INDEX receipts_effect_key ON {s}.receipts (effect_key)",
    f"ALTER TABLE {{s}}.receipts ADD COLUMN approval_id {_C}",
    "CREATE INDEX receipts_approval_id ON {s}.receipts (approval_id) WHERE approval_id IS NOT NULL",
    "UPDATE {s}.receipts SET approval_id = json::jsonb ->> 'approval_id' "
    "WHERE approval_id IS NULL AND position('\"approval_id\":\"' in json) > 0",
    "CREATE INDEX events_action_id ON {s}.events (action_id)",
    "CREATE INDEX events_approval_id ON {s}.events (approval_id) WHERE approval_id IS NOT NULL",
)

OLD_0006_SQLITE = (
    """CREATE TABLE verified_mark (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        hash TEXT NOT NULL,
        verified_at TEXT NOT NULL)""",
)

OLD_0006_POSTGRESQL = (
    f"""CREATE TABLE {{s}}.verified_mark (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash {_C} NOT NULL,
        verified_at {_C} NOT NULL)""",
)

OLD_0007_SQLITE = (
    "CREATE TABLE acts (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, subject TEXT NOT NULL, "
    "json TEXT NOT NULL, hash TEXT NOT NULL)",
    "CREATE INDEX acts_subject ON acts (subject, kind)",
    """CREATE TABLE acts_chain (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        hash TEXT NOT NULL,
        covers_from INTEGER NOT NULL)""",
    "INSERT INTO acts_chain SELECT 1, 0, 'sha256:' ||"
    "'0000000000000000000000000000000000000000000000000000000000000000', seq + 1 "
    "FROM receipt_chain WHERE id = 1",
    "CREATE TABLE acts_legacy (kind TEXT, subject TEXT, attempt INTEGER, PRIMARY KEY (kind, subject, attempt))",
    "INSERT INTO acts_legacy SELECT 'grant', approval_id, 0 FROM approvals "
    "WHERE status IN ('granted', 'consumed') OR approvers != '[]'",
    "INSERT INTO acts_legacy SELECT 'resolve', effect_key, attempt FROM effects "
    "WHERE resolved_by IS NOT NULL OR state IN ('committed', 'failed')",
    """CREATE TABLE prune_checkpoint (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL, hash TEXT NOT NULL, schema TEXT NOT NULL, at TEXT NOT NULL)""",
    """CREATE TABLE holds (
        hold_id TEXT PRIMARY KEY, from_seq INTEGER NOT NULL, to_seq INTEGER,
        reason TEXT NOT NULL, placed_by TEXT NOT NULL, placed_at TEXT NOT NULL,
        released_by TEXT, released_at TEXT)""",
    """CREATE TABLE anchors (
        id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, seq INTEGER NOT NULL,
        hash TEXT NOT NULL, token TEXT NOT NULL, at TEXT NOT NULL)""",
    "ALTER TABLE verified_mark ADD COLUMN acts_seq INTEGER",
    "ALTER TABLE verified_mark ADD COLUMN acts_hash TEXT",
)

OLD_0007_POSTGRESQL = (
    f"CREATE TABLE {{s}}.acts (seq BIGINT PRIMARY KEY, kind {_C} NOT NULL, subject {_C} NOT NULL, "
    f"json TEXT NOT NULL, hash {_C} NOT NULL)",
    "CREATE INDEX acts_subject ON {s}.acts (subject, kind)",
    f"""CREATE TABLE {{s}}.acts_chain (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash {_C} NOT NULL,
        covers_from BIGINT NOT NULL)""",
    "INSERT INTO {s}.acts_chain SELECT 1, 0, "
    "'sha256:0000000000000000000000000000000000000000000000000000000000000000', seq + 1 "
    "FROM {s}.receipt_chain WHERE id = 1",
    f"CREATE TABLE {{s}}.acts_legacy (kind {_C}, subject {_C}, attempt INTEGER, "
    "PRIMARY KEY (kind, subject, attempt))",
    "INSERT INTO {s}.acts_legacy SELECT 'grant', approval_id, 0 FROM {s}.approvals "
    "WHERE status IN ('granted', 'consumed') OR approvers != '[]'",
    "INSERT INTO {s}.acts_legacy SELECT 'resolve', effect_key, attempt FROM {s}.effects "
    "WHERE resolved_by IS NOT NULL OR state IN ('committed', 'failed')",
    f"""CREATE TABLE {{s}}.prune_checkpoint (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL, hash {_C} NOT NULL, schema {_C} NOT NULL, at {_C} NOT NULL)""",
    f"""CREATE TABLE {{s}}.holds (
        hold_id {_C} PRIMARY KEY, from_seq BIGINT NOT NULL, to_seq BIGINT,
        reason TEXT NOT NULL, placed_by {_C} NOT NULL, placed_at {_C} NOT NULL,
        released_by {_C}, released_at {_C})""",
    f"""CREATE TABLE {{s}}.anchors (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind {_C} NOT NULL, seq BIGINT NOT NULL,
        hash {_C} NOT NULL, token TEXT NOT NULL, at {_C} NOT NULL)""",
    "ALTER TABLE {s}.verified_mark ADD COLUMN acts_seq BIGINT",
    f"ALTER TABLE {{s}}.verified_mark ADD COLUMN acts_hash {_C}",
)

OLD_MIGRATIONS = {
    "sqlite": {
        "0001_initial": OLD_0001_SQLITE,
        "0002_approval_edits": (
            "ALTER TABLE approvals ADD COLUMN edited_action_json TEXT",
            "ALTER TABLE approvals ADD COLUMN edited_action_hash TEXT",
        ),
        "0003_authority": OLD_0003_SQLITE,
        "0004_notifications": OLD_0004_SQLITE,
        "0005_read_indexes": OLD_0005_SQLITE,
        "0006_verified_mark": OLD_0006_SQLITE,
        "0007_evidence": OLD_0007_SQLITE,
        "0008_replayable_effects": (
            "ALTER TABLE effects ADD COLUMN action_hash TEXT",
            "ALTER TABLE effects ADD COLUMN result_exact INTEGER",
        ),
        "0009_effect_receipts_index": (
            "DROP INDEX receipts_effect_key",
            "CREATE INDEX receipts_effect_key_seq ON receipts (effect_key, seq)",
        ),
    },
    "postgresql": {
        "0001_initial": OLD_0001_POSTGRESQL,
        "0002_approval_edits": (
            "ALTER TABLE {s}.approvals ADD COLUMN edited_action_json TEXT",
            f"ALTER TABLE {{s}}.approvals ADD COLUMN edited_action_hash {_C}",
        ),
        "0003_authority": OLD_0003_POSTGRESQL,
        "0004_notifications": OLD_0004_POSTGRESQL,
        "0005_read_indexes": OLD_0005_POSTGRESQL,
        "0006_verified_mark": OLD_0006_POSTGRESQL,
        "0007_evidence": OLD_0007_POSTGRESQL,
        "0008_replayable_effects": (
            f"ALTER TABLE {{s}}.effects ADD COLUMN action_hash {_C}",
            "ALTER TABLE {s}.effects ADD COLUMN result_exact INTEGER",
        ),
        "0009_effect_receipts_index": (
            "DROP INDEX {s}.receipts_effect_key",
            "CREATE INDEX receipts_effect_key_seq ON {s}.receipts (effect_key, seq)",
        ),
    },
}
OLD_STAMP = ("2026-11-01T09:00:00.000000Z", "0.1.0")


def old_statements(dialect: str, migrations: tuple[str, ...], schema: str = "") -> list[str]:
    """What the earlier build ran to create a store at ``migrations``, rows included."""
    statements = [OLD_SCHEMA_VERSION[dialect]]
    for migration_id in migrations:
        statements += OLD_MIGRATIONS[dialect][migration_id]
        table = "{s}.schema_version" if dialect == "postgresql" else "schema_version"
        statements.append(f"INSERT INTO {table} VALUES ('{migration_id}', '%s', '%s')" % OLD_STAMP)
    return [s.replace("{s}", f'"{schema}"') for s in statements]


# --------------------------------------------------------------------------- the list itself


def test_the_list_creates_every_table_column_and_index_of_the_metadata_once():
    columns: Counter[tuple[str, str]] = Counter()
    tables: Counter[str] = Counter()
    indexes: Counter[str] = Counter()
    for migration in SCHEMA_MIGRATIONS:
        for step in migration.steps:
            if isinstance(step, CreateTable):
                tables[step.element.name] += 1
                columns.update((step.element.name, c.element.name) for c in step.columns)
            elif isinstance(step, AddColumn):
                columns[(step.column.table.name, step.column.name)] += 1
            elif isinstance(step, CreateIndex):
                indexes[step.element.name] += 1
            elif isinstance(step, DropIndex):
                indexes[step.element.name] -= 1
    data = [t for t in metadata.sorted_tables if t is not schema_version]
    assert tables == Counter(t.name for t in data)
    assert columns == Counter((t.name, c.name) for t in data for c in t.c)
    assert +indexes == Counter(i.name for t in data for i in t.indexes)
    assert MIGRATIONS == (
        "0001_initial", "0002_approval_edits", "0003_authority", "0004_notifications",
        "0005_read_indexes",
        "0006_verified_mark",
        "0007_evidence",
        "0008_replayable_effects",
        "0009_effect_receipts_index",
    )  # fmt: skip
    assert HEAD == MIGRATIONS[-1]
    assert list(MIGRATIONS) == sorted(set(MIGRATIONS))
    # no hand-written DDL left beside the MetaData
    assert not [name for name in vars(schema_module) if re.match(r"_\d{4}_|_MIGRATION_SQL", name)]


def test_migration_sql_is_generated_per_dialect():
    lite = migration_sql(sqlite.dialect())
    pg = migration_sql(pg_driver.dialect(), "Ops")
    assert list(lite) == list(pg) == ["schema_version", *MIGRATIONS]
    lite_0001, pg_0001 = "\n".join(lite["0001_initial"]), "\n".join(pg["0001_initial"])
    assert "INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" in lite_0001 and "COLLATE" not in lite_0001
    assert "BIGINT GENERATED ALWAYS AS IDENTITY" in pg_0001
    assert 'CREATE TABLE "Ops".events' in pg_0001
    assert "edited_action" not in lite_0001 + pg_0001  # 0002 adds them
    assert pg["0002_approval_edits"] == (
        'ALTER TABLE "Ops".approvals ADD COLUMN edited_action_json TEXT',
        'ALTER TABLE "Ops".approvals ADD COLUMN edited_action_hash TEXT COLLATE "C"',
    )
    assert f"VALUES (1, 0, '{GENESIS_HASH}')" in lite["0001_initial"][-1]


# --------------------------------------------------------------------------- SQLite


def make_old_sqlite(path: Path, migrations: tuple[str, ...] = MIGRATIONS) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in old_statements("sqlite", migrations):
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def sqlite_catalog(path: Path) -> dict[str, Any]:
    """Every table's columns, indexes (with their columns), CHECKs and AUTOINCREMENT."""
    conn = sqlite3.connect(path)
    try:
        found: dict[str, Any] = {}
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' ORDER BY name")
        for name, sql in rows.fetchall():
            indexes = [
                (index[1], index[2], index[3], index[4],
                 tuple(c[2] for c in conn.execute(f"PRAGMA index_info('{index[1]}')")))
                for index in conn.execute(f"PRAGMA index_list('{name}')")
            ]  # fmt: skip
            found[name] = {
                "columns": conn.execute(f"PRAGMA table_xinfo('{name}')").fetchall(),
                "indexes": sorted(indexes),
                "checks": re.findall(r"CHECK\s*\(([^()]*)\)", sql or ""),
                "autoincrement": "AUTOINCREMENT" in (sql or "").upper(),
            }
        found["receipt_chain rows"] = conn.execute("SELECT * FROM receipt_chain").fetchall()
        return found
    finally:
        conn.close()


def sqlite_behaviour(path: Path) -> list[Any]:
    """What the constraints and defaults do, probed in a transaction that is rolled back."""
    conn = sqlite3.connect(path, isolation_level=None)
    seen: list[Any] = []

    def attempt(statement: str) -> None:
        try:
            conn.execute(statement)
            seen.append("ok")
        except sqlite3.IntegrityError as exc:
            seen.append(str(exc).split(":")[0])

    try:
        conn.execute("BEGIN")
        attempt("INSERT INTO receipt_chain VALUES (2, 0, 'x')")  # CHECK (id = 1)
        attempt("UPDATE receipt_chain SET id = 1")
        event = "INSERT INTO events (event_id, ts, type, data_json) VALUES (NULL, 't', 'x', '{}')"
        attempt(event)  # a rowid inserted as NULL gets the next id
        attempt(event)
        conn.execute("DELETE FROM events WHERE event_id = 2")
        attempt(event)  # AUTOINCREMENT: 2 is never handed out again
        seen.append(conn.execute("SELECT event_id FROM events").fetchall())
        attempt("INSERT INTO effects (effect_key, state, action_id, created_at, updated_at) "
                "VALUES ('k', 'reserved', 'a', 't', 't')")  # fmt: skip
        seen.append(conn.execute("SELECT attempt FROM effects").fetchall())
        attempt("INSERT INTO approvals (approval_id, action_hash, status, action_json, "
                "created_at, expires_at) VALUES ('r', 'h', 'pending', '{}', 't', 't')")  # fmt: skip
        seen.append(conn.execute("SELECT approvers, required_roles FROM approvals").fetchall())
        attempt("INSERT INTO receipts (receipt_id, seq) VALUES ('a', 1)")
        attempt("INSERT INTO receipts (receipt_id, seq) VALUES ('b', 1)")  # seq unique
        attempt("INSERT INTO receipts (receipt_id, seq) VALUES ('c', NULL)")
        attempt("INSERT INTO receipts (receipt_id, seq) VALUES ('d', NULL)")
        attempt("INSERT INTO receipts (receipt_id) VALUES ('a')")  # the key
        conn.execute("ROLLBACK")
        return seen
    finally:
        conn.close()


def without_rowid_not_null(catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with ``events.event_id``'s NOT NULL flag cleared: the generated DDL says NOT
    NULL (an identity on Postgres is NOT NULL), the earlier DDL did not; a rowid is never NULL
    either way (``sqlite_behaviour`` inserts one as NULL and it gets the next id)."""
    columns = catalog["events"]["columns"]
    assert columns[0][1:4] == ("event_id", "INTEGER", 1) and columns[0][5] == 1
    catalog["events"]["columns"] = [(*columns[0][:3], 0, *columns[0][4:]), *columns[1:]]
    return catalog


def test_sqlite_generated_schema_matches_the_hand_written_one(tmp_path):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_old_sqlite(old)
    SQLiteStateStore(new).close()
    old_catalog, new_catalog = sqlite_catalog(old), sqlite_catalog(new)
    assert old_catalog["events"]["columns"][0][3] == 0
    assert without_rowid_not_null(new_catalog) == old_catalog
    assert old_catalog["receipt_chain"]["checks"] == ["id = 1"]
    assert old_catalog["events"]["autoincrement"] and "sqlite_sequence" in old_catalog
    assert sqlite_behaviour(new) == sqlite_behaviour(old)
    assert sqlite_behaviour(new)[:2] == ["CHECK constraint failed", "ok"]


def test_sqlite_old_0001_store_upgraded_by_the_generated_0002(tmp_path):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_old_sqlite(old, MIGRATIONS[:1])
    SQLiteStateStore(old).close()  # applies 0002 from the MetaData
    SQLiteStateStore(new).close()
    assert sqlite_catalog(old) == without_rowid_not_null(sqlite_catalog(new))
    with sqlite3.connect(old) as conn:
        rows = conn.execute("SELECT migration_id, ctrlrun_version FROM schema_version").fetchall()
    assert [r[0] for r in sorted(rows)] == list(MIGRATIONS) and sorted(rows)[0][1] == "0.1.0"


def test_sqlite_0002_store_upgraded_by_the_generated_0003_works(tmp_path, clock):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_old_sqlite(old, MIGRATIONS[:2])
    store = SQLiteStateStore(old, clock=clock)  # applies 0003 from the MetaData
    exercise(store, clock)
    exercise_authority(store, clock)
    store.close()
    SQLiteStateStore(new).close()
    assert sqlite_catalog(old).keys() == sqlite_catalog(new).keys()
    for table in ("delegations", "budget_ledger"):
        assert sqlite_catalog(old)[table] == sqlite_catalog(new)[table]


@pytest.mark.parametrize(
    ("migration_id", "table"),
    [("0004_notifications", "notifications"), ("0006_verified_mark", "verified_mark")],
)
def test_sqlite_store_upgraded_by_a_generated_migration_keeps_working(tmp_path, clock, migration_id, table):
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    make_old_sqlite(old, MIGRATIONS[: MIGRATIONS.index(migration_id)])
    assert table not in sqlite_catalog(old)
    store = SQLiteStateStore(old, clock=clock)  # applies it (and any later one) from the MetaData
    exercise(store, clock)
    store.close()
    SQLiteStateStore(new).close()
    assert sqlite_catalog(old)[table] == sqlite_catalog(new)[table]
    with sqlite3.connect(old) as conn:
        rows = conn.execute("SELECT migration_id FROM schema_version").fetchall()
    assert {migration_id, HEAD} <= {r[0] for r in rows}


def test_sqlite_metadata_create_all_matches_the_migrations(tmp_path):
    """The migration list and the MetaData describe one schema."""
    made, migrated = tmp_path / "made.db", tmp_path / "migrated.db"
    engine = create_engine(f"sqlite:///{made}")
    metadata.create_all(engine)
    engine.dispose()
    SQLiteStateStore(migrated).close()
    made_catalog, migrated_catalog = sqlite_catalog(made), sqlite_catalog(migrated)
    assert made_catalog.pop("receipt_chain rows") == []  # the seed is the migration's
    migrated_catalog.pop("receipt_chain rows")
    assert made_catalog == migrated_catalog


def exercise(store: Any, clock: Any) -> None:
    """A reserve/commit, an approval consumed with a reservation, the hot path and the chain."""
    store.reserve_effect("k1", "a1", LEASE)
    store.begin_execution("k1", "a1")
    store.commit_effect("k1", "a1", {"ok": 1})
    request = granted_request(store, clock)
    store.consume_approval_and_reserve(
        request.request_id, request.action.action_hash, "k2", "a2", LEASE
    )
    store.start_attempt(action_id="a3", effect_key="k3", lease=LEASE,
                        events=lambda a, r: [make_event(EventType.EFFECT_RESERVED)])  # fmt: skip
    store.finish_attempt(effect_key="k3", action_id="a3", outcome=EffectState.COMMITTED,
                         result=3, events=[make_event()], receipt=make_receipt(1))  # fmt: skip
    store.record(events=[make_event()], receipt=make_receipt(2))
    assert store.get_effect("k1").state is EffectState.COMMITTED
    assert store.get_effect("k2").state is EffectState.RESERVED
    assert store.get_approval(request.request_id).status.value == "consumed"
    assert [e.event_id for e in store.events()] == [1, 2, 3]
    assert store.chain_head()[0] == 2 and verify_chain(store).ok


def exercise_authority(store: Any, clock: Any) -> None:
    """A delegation put and revoked; a charge taken, refused, released and taken again."""
    record = DelegationRecord("dlg_" + "0" * 32, "root", 1, "{}", "agent", None, "api", clock())
    store.put_delegation(record)
    assert store.revoke_delegation(record.delegation_id, by="cli:local", at=clock())
    assert store.delegations() == () and len(store.delegations(include_revoked=True)) == 1
    budget = [Charge("root", "amount", 7, 10, 86400)]
    store.reserve_effect("b1", "ab1", LEASE, charges=budget)
    with pytest.raises(BudgetExhausted):
        store.reserve_effect("b2", "ab2", LEASE, charges=budget)
    store.begin_execution("b1", "ab1")
    store.fail_effect("b1", "ab1", "no")
    store.reserve_effect("b2", "ab2", LEASE, charges=budget)
    assert [(c.effect_key, c.released_at is None) for c in store.consumptions()] == [
        ("b1", False), ("b2", True)
    ]


def test_sqlite_store_made_by_the_old_ddl_opens_and_works(tmp_path, clock):
    path = tmp_path / "old.db"
    make_old_sqlite(path)
    store = SQLiteStateStore(path, clock=clock)
    assert isinstance(store, StateStore)
    exercise(store, clock)
    exercise_authority(store, clock)
    store.close()
    again = SQLiteStateStore(path, clock=clock, migrate=False)
    assert again.get_effect("k3").result == 3 and verify_chain(again).ok
    again.close()


# --------------------------------------------------------------------------- Postgres


def pg_run(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url) as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)


def pg_rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def pg_catalog(url: str, schema: str) -> dict[str, Any]:
    """Columns (type, nullability, default, identity, collation), constraints, indexes, seed."""
    columns = pg_rows(
        url,
        "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, "
        "column_default, collation_name, is_identity, identity_generation, identity_start, "
        "identity_increment, identity_maximum, identity_minimum, identity_cycle, "
        "numeric_precision FROM information_schema.columns WHERE table_schema = %s "
        "ORDER BY table_name, ordinal_position",
        schema,
    )
    constraints = pg_rows(
        url,
        "SELECT rel.relname, con.conname, con.contype, pg_get_constraintdef(con.oid) "
        "FROM pg_constraint con JOIN pg_class rel ON rel.oid = con.conrelid "
        "JOIN pg_namespace n ON n.oid = rel.relnamespace WHERE n.nspname = %s ORDER BY 1, 2",
        schema,
    )
    indexes = pg_rows(
        url,
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s "
        "ORDER BY 1, 2",
        schema,
    )
    sequences = pg_rows(
        url,
        "SELECT sequencename, data_type::text, start_value, min_value, max_value, "
        "increment_by, cycle, cache_size FROM pg_sequences WHERE schemaname = %s ORDER BY 1",
        schema,
    )
    seed = pg_rows(url, f'SELECT id, seq, hash FROM "{schema}".receipt_chain')
    definitions = [
        (table, name, re.sub(rf'"?{re.escape(schema)}"?\.', "<schema>.", ddl))
        for table, name, ddl in indexes
    ]
    return {"columns": columns, "constraints": constraints, "indexes": definitions,
            "sequences": sequences, "seed": seed}  # fmt: skip


@pytest.fixture
def two_pg_schemas(pg_url):
    """Two fresh schemas, the second with a name that needs quoting."""
    quoted = f"ctrlrun_t_Q{secrets.token_hex(6)}"
    names = [create_pg_schema(pg_url), create_pg_schema(pg_url, quoted)]
    yield names
    for name in names:
        drop_pg_schema(pg_url, name)


@pytest.mark.postgres
def test_postgres_generated_schema_matches_the_hand_written_one(pg_url, two_pg_schemas):
    from ctrlrun.postgres import PostgresStateStore

    old, new = two_pg_schemas
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS, old))
    PostgresStateStore(pg_url, schema=new).close()
    old_catalog, new_catalog = pg_catalog(pg_url, old), pg_catalog(pg_url, new)
    assert new_catalog == old_catalog
    collated = {(r[0], r[2]) for r in old_catalog["columns"] if r[6] == "C"}
    assert ("approvals", "approvers") in collated
    assert ("approvals", "required_roles") not in collated  # as released
    assert any(
        r[2] == "event_id" and r[3] == "bigint" and r[7:9] == ("YES", "ALWAYS")
        for r in old_catalog["columns"]
    )
    assert ("receipt_chain", "receipt_chain_id_check", "c", "CHECK ((id = 1))") in {
        tuple(r) for r in old_catalog["constraints"]
    }
    assert old_catalog["seed"] == [(1, 0, GENESIS_HASH)]


@pytest.mark.postgres
def test_postgres_old_0001_schema_upgraded_by_the_generated_0002(pg_url, two_pg_schemas):
    from ctrlrun.postgres import PostgresStateStore

    old, new = two_pg_schemas
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS[:1], old))
    PostgresStateStore(pg_url, schema=old).close()
    PostgresStateStore(pg_url, schema=new).close()
    assert pg_catalog(pg_url, old) == pg_catalog(pg_url, new)


@pytest.mark.postgres
def test_postgres_metadata_create_all_matches_the_migrations(pg_url, two_pg_schemas):
    from ctrlrun.postgres import PostgresStateStore

    made, migrated = two_pg_schemas
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        metadata.create_all(conn.execution_options(schema_translate_map={None: made}))
    engine.dispose()
    PostgresStateStore(pg_url, schema=migrated).close()
    made_catalog, migrated_catalog = pg_catalog(pg_url, made), pg_catalog(pg_url, migrated)
    assert made_catalog.pop("seed") == [] and migrated_catalog.pop("seed")
    assert made_catalog == migrated_catalog


@pytest.mark.postgres
def test_postgres_store_made_by_the_old_ddl_opens_and_works(pg_url, two_pg_schemas, clock):
    from ctrlrun.postgres import PostgresStateStore

    old = two_pg_schemas[1]
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS, old))
    store = PostgresStateStore(pg_url, schema=old, clock=clock)
    assert isinstance(store, StateStore)
    exercise(store, clock)
    exercise_authority(store, clock)
    store.close()
    again = PostgresStateStore(pg_url, schema=old, clock=clock, migrate=False)
    assert again.get_effect("k3").result == 3 and verify_chain(again).ok
    again.close()


@pytest.mark.postgres
def test_postgres_0002_schema_upgraded_by_the_generated_0003_works(pg_url, two_pg_schemas, clock):
    from ctrlrun.postgres import PostgresStateStore

    old, new = two_pg_schemas
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS[:2], old))
    store = PostgresStateStore(pg_url, schema=old, clock=clock)
    exercise_authority(store, clock)
    store.close()
    PostgresStateStore(pg_url, schema=new).close()
    old_catalog, new_catalog = pg_catalog(pg_url, old), pg_catalog(pg_url, new)
    old_catalog.pop("seed"), new_catalog.pop("seed")
    assert old_catalog == new_catalog


@pytest.mark.postgres
def test_postgres_0003_schema_upgraded_by_the_generated_0004_works(pg_url, two_pg_schemas, clock):
    from ctrlrun.postgres import PostgresStateStore

    old, new = two_pg_schemas
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS[:3], old))
    store = PostgresStateStore(pg_url, schema=old, clock=clock)
    exercise(store, clock)
    store.close()
    PostgresStateStore(pg_url, schema=new).close()
    old_catalog, new_catalog = pg_catalog(pg_url, old), pg_catalog(pg_url, new)
    old_catalog.pop("seed"), new_catalog.pop("seed")
    assert old_catalog == new_catalog
    assert any(r[0] == "notifications" for r in new_catalog["columns"])


# --------------------------------------------------------------------------- 0005: approval_id filled

_APPROVED = '{"receipt_id":"ctr_a","arguments":{"approval_id":"apr_fake"},"approval_id":"apr_1"}'
_OLD_RECEIPTS = (
    ("ctr_a", _APPROVED, 1),
    ("ctr_b", '{"receipt_id":"ctr_b","approval_id":null}', 2),
    ("ctr_c", 'not json "approval_id":"apr_x"', 3),  # unreadable: left NULL, the rest filled
)


def _insert_old_receipts(table: str) -> list[str]:
    return [
        f"INSERT INTO {table} (receipt_id, json, seq) VALUES "
        f"('{rid}', '{text}', {seq})"
        for rid, text, seq in _OLD_RECEIPTS
    ]


def test_sqlite_0004_store_gets_its_receipts_approval_ids_filled(tmp_path, clock):
    old = tmp_path / "old.db"
    make_old_sqlite(old, MIGRATIONS[:4])
    with sqlite3.connect(old) as conn:
        for statement in _insert_old_receipts("receipts"):
            conn.execute(statement)
    SQLiteStateStore(old, clock=clock).close()  # applies 0005
    with sqlite3.connect(old) as conn:
        rows = conn.execute("SELECT receipt_id, approval_id FROM receipts ORDER BY seq").fetchall()
    assert rows == [("ctr_a", "apr_1"), ("ctr_b", None), ("ctr_c", None)]


@pytest.mark.postgres
def test_postgres_0004_schema_gets_its_receipts_approval_ids_filled(pg_url, two_pg_schemas, clock):
    from ctrlrun.postgres import PostgresStateStore

    old = two_pg_schemas[1]
    pg_run(pg_url, *old_statements("postgresql", MIGRATIONS[:4], old),
           *_insert_old_receipts(f'"{old}".receipts'))  # fmt: skip
    PostgresStateStore(pg_url, schema=old, clock=clock).close()  # applies 0005
    rows = pg_rows(pg_url, f'SELECT receipt_id, approval_id FROM "{old}".receipts ORDER BY seq')
    assert [tuple(r) for r in rows] == [("ctr_a", "apr_1"), ("ctr_b", None), ("ctr_c", None)]
