"""The tables (one SQLAlchemy ``MetaData``), the recorded migrations, and their classification."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version

from sqlalchemy import Column, Connection, Integer, MetaData, Table, Text, inspect, select

from .._time import format_precise, utc_now
from ..errors import SchemaMismatch
from ..receipt import GENESIS_HASH

__all__ = [
    "HEAD",
    "MIGRATIONS",
    "apply_migrations",
    "approvals",
    "classify",
    "effects",
    "events",
    "metadata",
    "read_schema",
    "receipt_chain",
    "receipts",
    "running_version",
    "schema_version",
]

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("migration_id", Text, primary_key=True),
    Column("applied_at", Text, nullable=False),
    Column("ctrlrun_version", Text, nullable=False),
)

effects = Table(
    "effects",
    metadata,
    Column("effect_key", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("action_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False, default=1),
    Column("lease_expires_at", Text),
    Column("result_json", Text),
    Column("error", Text),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Column("resolved_by", Text),
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", Text, primary_key=True),
    Column("action_hash", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("action_json", Text, nullable=False),
    Column("approver", Text),
    Column("created_at", Text, nullable=False),
    Column("granted_at", Text),
    Column("expires_at", Text, nullable=False),
    Column("consumed_at", Text),
    Column("policy_hash_at_approval", Text),
    Column("precondition_fingerprint", Text),
    Column("approvers", Text),
    Column("required_roles", Text),
    Column("approvals_required", Integer),
    Column("edited_action_json", Text),
    Column("edited_action_hash", Text),
)

events = Table(
    "events",
    metadata,
    Column("event_id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("action_id", Text),
    Column("effect_key", Text),
    Column("approval_id", Text),
    Column("data_json", Text, nullable=False),
)

receipts = Table(
    "receipts",
    metadata,
    Column("receipt_id", Text, primary_key=True),
    Column("action_id", Text),
    Column("effect_key", Text),
    Column("result", Text),
    Column("json", Text),
    Column("ts", Text),
    Column("seq", Integer, unique=True),
    Column("prev_hash", Text),
    Column("hash", Text),
)

receipt_chain = Table(
    "receipt_chain",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("seq", Integer, nullable=False),
    Column("hash", Text, nullable=False),
)

# Plain SQL per dialect, forward-only; ids sort in application order. Postgres statements name
# their schema through ``{s}`` (the quoted schema, filled in by ``apply_migrations``); every text
# column there compares bytewise (``COLLATE "C"``), as SQLite's and Python's comparisons do, so
# identifiers never fold and the ISO timestamps sort like the times they spell.
_SCHEMA_VERSION_DDL = {
    "sqlite": (
        "CREATE TABLE schema_version (migration_id TEXT PRIMARY KEY, "
        "applied_at TEXT NOT NULL, ctrlrun_version TEXT NOT NULL)"
    ),
    "postgresql": (
        'CREATE TABLE {s}.schema_version (migration_id TEXT COLLATE "C" PRIMARY KEY, '
        'applied_at TEXT COLLATE "C" NOT NULL, ctrlrun_version TEXT COLLATE "C" NOT NULL)'
    ),
}

_0001_SQLITE = (
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

_0001_POSTGRESQL = (
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

# Approve with edits: the action the human approved instead, and its hash (what the grant binds).
_0002_SQLITE = (
    "ALTER TABLE approvals ADD COLUMN edited_action_json TEXT",
    "ALTER TABLE approvals ADD COLUMN edited_action_hash TEXT",
)
_0002_POSTGRESQL = (
    "ALTER TABLE {s}.approvals ADD COLUMN edited_action_json TEXT",
    f"ALTER TABLE {{s}}.approvals ADD COLUMN edited_action_hash {_C}",
)

_MIGRATION_SQL: dict[str, dict[str, tuple[str, ...]]] = {
    "0001_initial": {"sqlite": _0001_SQLITE, "postgresql": _0001_POSTGRESQL},
    "0002_approval_edits": {"sqlite": _0002_SQLITE, "postgresql": _0002_POSTGRESQL},
}

MIGRATIONS: tuple[str, ...] = ("0001_initial", "0002_approval_edits")
HEAD = MIGRATIONS[-1]


def running_version() -> str:
    """The version of this ctrlrun build, as stamped on the migrations it applies."""
    try:
        return version("ctrlrun")
    except PackageNotFoundError:
        return "0.0.0"


def read_schema(
    conn: Connection, schema: str | None = None
) -> tuple[bool, dict[str, str], tuple[str, ...]]:
    """``(has schema_version, {applied id: version stamped}, other table names)``; reads only.

    ``schema`` names the Postgres schema to look in (the connection's ``schema_translate_map``
    must map the tables there too); SQLite passes none.
    """
    names = set(inspect(conn).get_table_names(schema=schema))
    others = tuple(sorted(names - {"schema_version"}))
    if "schema_version" not in names:
        return False, {}, others
    rows = conn.execute(select(schema_version.c.migration_id, schema_version.c.ctrlrun_version))
    return True, {row[0]: row[1] for row in rows}, others


def classify(
    has_version_table: bool,
    applied: Mapping[str, str],
    other_tables: Sequence[str],
    known: Sequence[str] = MIGRATIONS,
) -> tuple[str, ...]:
    """The migrations still to apply, in order; ``SchemaMismatch`` for a database not to touch."""
    running = running_version()
    known = tuple(known)
    recorded = tuple(sorted(applied))
    if not has_version_table:
        if not other_tables:
            return known
        raise SchemaMismatch(
            f"the database has tables ({', '.join(other_tables)}) but no schema_version table: "
            "it is not a ctrlrun store (or predates versioning); use a new path",
            applied=(),
            known=known,
            running=running,
        )
    unknown = [m for m in recorded if m not in known]
    if unknown:
        stamped = ", ".join(f"{m} (written by ctrlrun {applied[m]})" for m in unknown)
        raise SchemaMismatch(
            f"the store has migrations this build does not know: {stamped}; this is ctrlrun "
            f"{running}, which knows {list(known)}: upgrade ctrlrun to open it",
            applied=recorded,
            known=known,
            running=running,
        )
    if recorded != known[: len(recorded)]:
        missing = [m for m in known if m not in applied and m < recorded[-1]]
        raise SchemaMismatch(
            f"the store's migrations {list(recorded)} have a gap (missing {missing}); "
            "restore it from a backup",
            applied=recorded,
            known=known,
            running=running,
        )
    return known[len(recorded) :]


def apply_migrations(
    conn: Connection,
    missing: Sequence[str],
    *,
    create_version_table: bool,
    schema: str | None = None,
) -> None:
    """Run each missing migration's DDL and ``schema_version`` row in the caller's transaction.

    Postgres statements are written into ``schema`` (quoted as the dialect quotes it).
    """
    dialect = conn.dialect.name
    stamp = running_version()
    quoted = conn.dialect.identifier_preparer.quote_schema(schema) if schema else None

    def run(statement: str) -> None:
        if dialect == "postgresql":
            assert quoted is not None, "a Postgres migration needs its schema"
            statement = statement.replace("{s}", quoted)
        conn.exec_driver_sql(statement)

    if create_version_table:
        run(_SCHEMA_VERSION_DDL[dialect])
    for migration_id in missing:
        for statement in _MIGRATION_SQL[migration_id][dialect]:
            run(statement)
        conn.execute(
            schema_version.insert().values(
                migration_id=migration_id,
                applied_at=format_precise(utc_now()),
                ctrlrun_version=stamp,
            )
        )
