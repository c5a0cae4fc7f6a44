"""The tables (one SQLAlchemy ``MetaData``), the one migration list, and its classification.

The ``MetaData`` is the only description of the schema. Each migration is a list of
dialect-neutral steps (``CreateTable``, ``CreateIndex``, ``AddColumn``, a seed ``INSERT``) built
from it; SQLAlchemy writes each step's DDL for the connection's dialect, and the Postgres schema
comes from the same ``schema_translate_map`` every other statement of the store uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Executable,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex

from .._time import format_precise, utc_now
from ..errors import SchemaMismatch
from ..evidence.receipt import GENESIS_HASH
from .ddl import AddColumn, BytewiseText, FillReceiptApprovals

__all__ = [
    "HEAD",
    "MIGRATIONS",
    "SCHEMA_MIGRATIONS",
    "AddColumn",
    "BytewiseText",
    "FillReceiptApprovals",
    "Migration",
    "apply_migrations",
    "acts",
    "acts_chain",
    "acts_legacy",
    "anchors",
    "approvals",
    "budget_ledger",
    "classify",
    "delegations",
    "effects",
    "events",
    "metadata",
    "migration_sql",
    "holds",
    "notifications",
    "prune_checkpoint",
    "read_schema",
    "receipt_chain",
    "receipts",
    "running_version",
    "schema_version",
    "verified_mark",
]


# --------------------------------------------------------------------------- column types


# A counter that may pass 2**31 (event ids, receipt sequence numbers): BIGINT on Postgres. SQLite
# keeps INTEGER (64-bit there), which its rowid and AUTOINCREMENT require.
_COUNTER = Integer().with_variant(BigInteger(), "postgresql")
_ID = BytewiseText  # identifiers and timestamps
_JSON = Text  # payloads: compared by nobody, stored in the database's own collation


def _key(name: str, type_: Any, *constraints: CheckConstraint) -> Column[Any]:
    """A primary-key column as ``<name> <type> PRIMARY KEY`` declares it: SQLite's catalog keeps
    such a key nullable (Postgres makes every key NOT NULL anyway); nothing autoincrements."""
    return Column(name, type_, *constraints, primary_key=True, nullable=True, autoincrement=False)


def _where_set(name: str, column: Column[Any]) -> Index:
    """A partial index over the rows where ``column`` is set: a row without it costs no write."""
    where = column.is_not(None)
    return Index(name, column, sqlite_where=where, postgresql_where=where)


# --------------------------------------------------------------------------- the tables

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    _key("migration_id", _ID),
    Column("applied_at", _ID, nullable=False),
    Column("ctrlrun_version", _ID, nullable=False),
)

effects = Table(
    "effects",
    metadata,
    _key("effect_key", _ID),
    Column("state", _ID, nullable=False),
    Column("action_id", _ID, nullable=False),
    Column("attempt", Integer, nullable=False, default=1, server_default=text("1")),
    Column("lease_expires_at", _ID),
    Column("result_json", _JSON),
    Column("error", Text),
    Column("created_at", _ID, nullable=False),
    Column("updated_at", _ID, nullable=False),
    Column("resolved_by", _ID),
    Column("action_hash", _ID),  # the action whose attempt holds or settled the key
    Column("result_exact", Integer),  # 1: result_json gives back the returned value type for type
)
Index("effects_state", effects.c.state)
Index("effects_created", effects.c.created_at, effects.c.effect_key)  # the listing's order

approvals = Table(
    "approvals",
    metadata,
    _key("approval_id", _ID),
    Column("action_hash", _ID, nullable=False),
    Column("status", _ID, nullable=False),
    Column("action_json", _JSON, nullable=False),
    Column("approver", _ID),
    Column("created_at", _ID, nullable=False),
    Column("granted_at", _ID),
    Column("expires_at", _ID, nullable=False),
    Column("consumed_at", _ID),
    Column("policy_hash_at_approval", _ID),
    Column("precondition_fingerprint", _ID),
    # two JSON lists; 0001 declared the first COLLATE "C" on Postgres and the second not
    Column("approvers", _ID, nullable=False, server_default=text("'[]'")),
    Column("required_roles", _JSON, nullable=False, server_default=text("'[]'")),
    Column("approvals_required", Integer),
    # approve with edits: the action the human approved instead, and its hash (what binds)
    Column("edited_action_json", _JSON),
    Column("edited_action_hash", _ID),
)
Index("approvals_action_hash", approvals.c.action_hash)
Index("approvals_status_expires", approvals.c.status, approvals.c.expires_at)

events = Table(
    "events",
    metadata,
    # SQLite: INTEGER PRIMARY KEY AUTOINCREMENT, the rowid (ids never reused); Postgres: BIGINT
    # GENERATED ALWAYS AS IDENTITY. An identity is NOT NULL, so SQLite's DDL says NOT NULL too,
    # which changes nothing there: a rowid is never NULL (one inserted as NULL is assigned).
    Column("event_id", _COUNTER, Identity(always=True), primary_key=True),
    Column("ts", _ID, nullable=False),
    Column("type", _ID, nullable=False),
    Column("action_id", _ID),
    Column("effect_key", _ID),
    Column("approval_id", _ID),
    Column("data_json", _JSON, nullable=False),
    sqlite_autoincrement=True,
)

receipts = Table(
    "receipts",
    metadata,
    _key("receipt_id", _ID),
    Column("action_id", _ID),
    Column("effect_key", _ID),
    Column("result", _ID),
    Column("json", _JSON),
    Column("ts", _ID),
    Column("seq", _COUNTER, unique=True),
    Column("prev_hash", _ID),
    Column("hash", _ID),
    Column("approval_id", _ID),  # the document's approval_id, for lookups by request
)
Index("receipts_action_id", receipts.c.action_id)
# 0005 indexed receipts by key alone; 0009 replaced that index with one by (key, seq), so a key's
# last receipt is one probe however many receipts the key has. The old one stays out of the
# MetaData (which describes the schema as it is now) but is kept for the steps that name it.
_RECEIPTS_BY_KEY_0005 = Index("receipts_effect_key", receipts.c.effect_key)
receipts.indexes.discard(_RECEIPTS_BY_KEY_0005)
Index("receipts_effect_key_seq", receipts.c.effect_key, receipts.c.seq)
_where_set("receipts_approval_id", receipts.c.approval_id)
Index("events_action_id", events.c.action_id)
_where_set("events_approval_id", events.c.approval_id)

receipt_chain = Table(
    "receipt_chain",
    metadata,
    _key("id", Integer, CheckConstraint("id = 1")),  # the one row
    Column("seq", _COUNTER, nullable=False),
    Column("hash", _ID, nullable=False),
)

delegations = Table(
    "delegations",
    metadata,
    _key("delegation_id", _ID),
    Column("parent_id", _ID, nullable=False),
    Column("depth", Integer, nullable=False),
    Column("grant_json", _JSON, nullable=False),
    Column("created_by_agent", _ID, nullable=False),
    Column("created_by_user", _ID),
    Column("created_via", _ID, nullable=False),
    Column("created_at", _ID, nullable=False),
    Column("revoked_at", _ID),
    Column("revoked_by", _ID),
)
Index("delegations_parent", delegations.c.parent_id)

# One row per charge an attempt took; released (never deleted, never decremented) when that
# attempt's record moves to failed. The unique key also serves the release's effect_key lookup.
budget_ledger = Table(
    "budget_ledger",
    metadata,
    Column("id", _COUNTER, Identity(always=True), primary_key=True),
    Column("grant_id", _ID, nullable=False),
    Column("metric", _ID, nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("effect_key", _ID, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("consumed_at", _ID, nullable=False),
    Column("released_at", _ID),
    UniqueConstraint("effect_key", "attempt", "grant_id", "metric", name="budget_ledger_charge"),
    sqlite_autoincrement=True,
)
Index(
    "budget_ledger_window",
    budget_ledger.c.grant_id, budget_ledger.c.metric, budget_ledger.c.consumed_at,
)  # fmt: skip


# One delivery claim per (subject, kind, target): the console's notifier inserts the row before
# sending and keeps each attempt's result on it. next_attempt_at is NULL once nothing is due.
notifications = Table(
    "notifications",
    metadata,
    _key("delivery_id", _ID),
    Column("subject_id", _ID, nullable=False),
    Column("kind", _ID, nullable=False),
    Column("target", _ID, nullable=False),
    Column("body", _JSON, nullable=False),
    Column("created_at", _ID, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_status", Text),
    Column("last_attempt_at", _ID),
    Column("next_attempt_at", _ID),
    Column("delivered_at", _ID),
    UniqueConstraint("subject_id", "kind", "target", name="notifications_claim"),
)
Index("notifications_due", notifications.c.next_attempt_at)


# --------------------------------------------------------------------------- migration steps


verified_mark = Table(
    "verified_mark",
    metadata,
    _key("id", Integer, CheckConstraint("id = 1")),  # the one row: the last verified head
    Column("seq", _COUNTER, nullable=False),
    Column("hash", _ID, nullable=False),
    Column("verified_at", _ID, nullable=False),
    Column("acts_seq", _COUNTER),  # the acts chain's head it verified too
    Column("acts_hash", _ID),
)

# The operator acts chain: one row per act, hash-chained like receipts, and its one head row.
# ``covers_from``: the first receipt seq the cross-check covers (1 for a store made with it).
acts = Table(
    "acts",
    metadata,
    _key("seq", _COUNTER),
    Column("kind", _ID, nullable=False),
    Column("subject", _ID, nullable=False),
    Column("json", _JSON, nullable=False),
    Column("hash", _ID, nullable=False),
)
Index("acts_subject", acts.c.subject, acts.c.kind)

acts_chain = Table(
    "acts_chain",
    metadata,
    _key("id", Integer, CheckConstraint("id = 1")),
    Column("seq", _COUNTER, nullable=False),
    Column("hash", _ID, nullable=False),
    Column("covers_from", _COUNTER, nullable=False),
)

# The answers a store held when the acts chain was added (grants by request id, resolutions by
# key and attempt): accounted for without an act. Written once, by that migration.
acts_legacy = Table(
    "acts_legacy",
    metadata,
    _key("kind", _ID),
    _key("subject", _ID),
    _key("attempt", Integer),
)

# Where a prune left the chain: the last deleted receipt's seq and hash (the one row).
prune_checkpoint = Table(
    "prune_checkpoint",
    metadata,
    _key("id", Integer, CheckConstraint("id = 1")),
    Column("seq", _COUNTER, nullable=False),
    Column("hash", _ID, nullable=False),
    Column("schema", _ID, nullable=False),
    Column("at", _ID, nullable=False),
)

holds = Table(
    "holds",
    metadata,
    _key("hold_id", _ID),
    Column("from_seq", _COUNTER, nullable=False),
    Column("to_seq", _COUNTER),  # NULL: open-ended, everything written later too
    Column("reason", Text, nullable=False),
    Column("placed_by", _ID, nullable=False),
    Column("placed_at", _ID, nullable=False),
    Column("released_by", _ID),
    Column("released_at", _ID),
)

# A local note of the anchors made from this store; the provider's history is the evidence.
anchors = Table(
    "anchors",
    metadata,
    Column("id", _COUNTER, Identity(always=True), primary_key=True),
    Column("kind", _ID, nullable=False),
    Column("seq", _COUNTER, nullable=False),
    Column("hash", _ID, nullable=False),
    Column("token", Text, nullable=False),
    Column("at", _ID, nullable=False),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True)
class Migration:
    """One recorded change: its id (as ``schema_version`` stores it) and its ordered steps."""

    migration_id: str
    steps: tuple[Executable, ...]


def _as_of_creation(migrations: tuple[Migration, ...]) -> tuple[Migration, ...]:
    """Each ``CreateTable`` step without the columns a later ``AddColumn`` step brings, so every
    migration writes today what it wrote when it was released."""
    added = {
        (step.column.table.name, step.column.name)
        for migration in migrations
        for step in migration.steps
        if isinstance(step, AddColumn)
    }
    for migration in migrations:
        for step in migration.steps:
            if isinstance(step, CreateTable):
                name = step.element.name
                step.columns = [c for c in step.columns if (name, c.element.name) not in added]
    return migrations


def _index(table: Table, name: str) -> CreateIndex:
    (index,) = (i for i in table.indexes if i.name == name)
    return CreateIndex(index)


# Forward-only; ids sort in application order. Never edit a released migration: add one.
SCHEMA_MIGRATIONS: tuple[Migration, ...] = _as_of_creation(
    (
        Migration(
            "0001_initial",
            (
                CreateTable(effects),
                _index(effects, "effects_state"),
                CreateTable(approvals),
                _index(approvals, "approvals_action_hash"),
                _index(approvals, "approvals_status_expires"),
                CreateTable(events),
                CreateTable(receipts),
                CreateTable(receipt_chain),
                receipt_chain.insert().values(id=1, seq=0, hash=GENESIS_HASH),
            ),
        ),
        Migration(
            "0002_approval_edits",
            (AddColumn(approvals.c.edited_action_json), AddColumn(approvals.c.edited_action_hash)),
        ),
        Migration(
            "0003_authority",
            (
                CreateTable(delegations),
                _index(delegations, "delegations_parent"),
                CreateTable(budget_ledger),
                _index(budget_ledger, "budget_ledger_window"),
            ),
        ),
        Migration(
            "0004_notifications",
            (CreateTable(notifications), _index(notifications, "notifications_due")),
        ),
        Migration(
            "0005_read_indexes",
            (
                _index(effects, "effects_created"),
                _index(receipts, "receipts_action_id"),
                CreateIndex(_RECEIPTS_BY_KEY_0005),
                AddColumn(receipts.c.approval_id),
                _index(receipts, "receipts_approval_id"),
                FillReceiptApprovals(receipts),
                _index(events, "events_action_id"),
                _index(events, "events_approval_id"),
            ),
        ),
        Migration("0006_verified_mark", (CreateTable(verified_mark),)),
        Migration(
            "0007_evidence",
            (
                CreateTable(acts),
                _index(acts, "acts_subject"),
                CreateTable(acts_chain),
                acts_chain.insert().from_select(
                    ["id", "seq", "hash", "covers_from"],
                    select(literal(1), literal(0), literal(GENESIS_HASH), receipt_chain.c.seq + 1)
                    .where(receipt_chain.c.id == 1),
                ),
                CreateTable(acts_legacy),
                acts_legacy.insert().from_select(
                    ["kind", "subject", "attempt"],
                    select(literal("grant"), approvals.c.approval_id, literal(0)).where(or_(
                        approvals.c.status.in_(("granted", "consumed")), approvals.c.approvers != "[]",
                    )),
                ),
                acts_legacy.insert().from_select(
                    ["kind", "subject", "attempt"],
                    select(literal("resolve"), effects.c.effect_key, effects.c.attempt).where(or_(
                        effects.c.resolved_by.is_not(None), effects.c.state.in_(("committed", "failed")),
                    )),
                ),
                CreateTable(prune_checkpoint),
                CreateTable(holds),
                CreateTable(anchors),
                AddColumn(verified_mark.c.acts_seq),
                AddColumn(verified_mark.c.acts_hash),
            ),
        ),
        Migration(
            "0008_replayable_effects",
            (AddColumn(effects.c.action_hash), AddColumn(effects.c.result_exact)),
        ),
        Migration(
            "0009_effect_receipts_index",
            (DropIndex(_RECEIPTS_BY_KEY_0005), _index(receipts, "receipts_effect_key_seq")),
        ),
    )
)

MIGRATIONS: tuple[str, ...] = tuple(m.migration_id for m in SCHEMA_MIGRATIONS)
HEAD = MIGRATIONS[-1]
_BY_ID = {m.migration_id: m for m in SCHEMA_MIGRATIONS}


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
        stamped = ", ".join(f"{m} (stamped version {applied[m]})" for m in unknown)
        raise SchemaMismatch(
            f"the store was written by another program or another version of ctrlrun: it has "
            f"migrations {stamped}, which this ctrlrun {running} does not know (it knows "
            f"{list(known)}); it was left untouched. Point ctrlrun at another path for a store "
            "of its own, or open this one with the program that wrote it",
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


def _translate(schema: str | None) -> dict[str, Any]:
    return {"schema_translate_map": {None: schema}} if schema else {}


def apply_migrations(
    conn: Connection,
    missing: Sequence[str],
    *,
    create_version_table: bool,
    schema: str | None = None,
) -> None:
    """Run each missing migration's steps and ``schema_version`` row in the caller's transaction.

    The same steps run on both dialects; on Postgres they land in ``schema`` (named as the
    store's ``schema_translate_map`` names it, quoted by the dialect where needed).
    """
    options = _translate(schema)
    stamp = running_version()
    if create_version_table:
        conn.execute(CreateTable(schema_version), execution_options=options)
    for migration_id in missing:
        for step in _BY_ID[migration_id].steps:
            conn.execute(step, execution_options=options)
        conn.execute(
            schema_version.insert().values(
                migration_id=migration_id,
                applied_at=format_precise(utc_now()),
                ctrlrun_version=stamp,
            ),
            execution_options=options,
        )


def migration_sql(dialect: Dialect, schema: str | None = None) -> dict[str, tuple[str, ...]]:
    """The SQL each migration runs on ``dialect`` (in ``schema`` on Postgres), as text to read.

    The version table's ``CREATE TABLE`` comes first, under the key ``"schema_version"``.
    """
    options = _translate(schema)

    def render(step: Executable) -> str:
        compiled = step.compile(  # type: ignore[attr-defined]
            dialect=dialect,
            compile_kwargs={"literal_binds": True},
            render_schema_translate=bool(options),
            **options,
        )
        return str(compiled).strip()

    out: dict[str, tuple[str, ...]] = {"schema_version": (render(CreateTable(schema_version)),)}
    for migration in SCHEMA_MIGRATIONS:
        out[migration.migration_id] = tuple(render(step) for step in migration.steps)
    return out
