"""The SQL stores' delegation and ledger rows: their statements (written once with SQLAlchemy
Core, compiled per dialect and schema) and the ``Tx`` row operations that send them.

On Postgres (READ COMMITTED) the writers charging one budget are serialized by a
transaction-scoped advisory lock per ``(grant_id, metric)``, taken in sorted order before its
sums are read, in a statement of its own: a statement's snapshot is taken when it starts, so
the sums must be read by a later statement than the one that waited for the lock. The lock
ends with the transaction, so a transaction-mode pooler stays safe. SQLite needs no lock: every
write transaction is ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Table, bindparam, func, insert, literal_column, select, update
from sqlalchemy.sql.expression import ClauseElement

from ..authority.ledger import Consumption, DelegationRecord
from . import codec
from .ledger import (
    DELEGATION_FIELDS,
    LEDGER_FIELDS,
    budget_lock_key,
    consumption_from_row,
    delegation_from_row,
    delegation_to_row,
)
from .compiled import Compiled

__all__ = ["LedgerRows", "LedgerStatements"]

_ADDED = ("grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at")


class LedgerStatements:
    """The statements of the ``delegations`` and ``budget_ledger`` tables, compiled on first
    use by the owning ``Statements`` (one dialect, one schema)."""

    def __init__(self, statements: Any) -> None:
        self._s = statements
        d: Table = statements.delegations
        g: Table = statements.ledger
        self.d, self.g = d, g
        compile = statements.compile
        assert tuple(d.c.keys()) == DELEGATION_FIELDS and tuple(g.c.keys()) == LEDGER_FIELDS
        self.delegation = compile(select(*d.c).where(d.c.delegation_id == bindparam("id")))
        self.insert_delegation = compile(
            statements._insert(d).values({n: bindparam(n) for n in DELEGATION_FIELDS})
            .on_conflict_do_nothing(index_elements=["delegation_id"])
            .returning(d.c.delegation_id)
        )  # fmt: skip
        self.revoke = compile(
            update(d).where(d.c.delegation_id == bindparam("id"), d.c.revoked_at.is_(None))
            .values(revoked_at=bindparam("at"), revoked_by=bindparam("by"))
        )  # fmt: skip
        self.release = compile(
            update(g).where(g.c.effect_key == bindparam("key"), g.c.released_at.is_(None))
            .values(released_at=bindparam("at"))
        )  # fmt: skip
        self.lock: Compiled | None = None
        if statements.name == "postgresql":
            self.lock = compile(
                select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger)))
            )

    def _cached(self, key: Any, build: Callable[[], ClauseElement]) -> Compiled:
        return self._s._cached(key, build)  # type: ignore[no-any-return]

    def list_delegations(self, include_revoked: bool, by_parent: bool) -> Compiled:
        def build() -> Any:
            d = self.d
            query = select(*d.c).order_by(d.c.created_at, d.c.delegation_id)
            if not include_revoked:
                query = query.where(d.c.revoked_at.is_(None))
            return query.where(d.c.parent_id == bindparam("parent")) if by_parent else query

        return self._cached(("delegations", include_revoked, by_parent), build)

    def spent(self, windows: int) -> Compiled:
        """One row ``(i, sum)`` per window ``i``: the sum of its grant's and metric's
        un-released rows consumed at or after its ``since``."""

        def build() -> Any:
            g = self.g
            parts = [
                select(literal_column(str(i)), func.coalesce(func.sum(g.c.amount), literal_column("0"))).where(
                    g.c.grant_id == bindparam(f"grant_{i}"), g.c.metric == bindparam(f"metric_{i}"),
                    g.c.released_at.is_(None), g.c.consumed_at >= bindparam(f"since_{i}"),
                )
                for i in range(windows)
            ]  # fmt: skip
            return parts[0] if windows == 1 else parts[0].union_all(*parts[1:])

        return self._cached(("spent", windows), build)

    def insert_consumptions(self, rows: int) -> Compiled:
        def build() -> Any:
            values: list[dict[str, Any]] = [
                {n: bindparam(f"{n}_{i}") for n in _ADDED} for i in range(rows)
            ]
            return insert(self.g).values(values)

        return self._cached(("consume", rows), build)

    def consumptions(self, grant: bool, metric: bool, since: bool, key: bool) -> Compiled:
        def build() -> Any:
            g = self.g
            query = select(*g.c).order_by(g.c.id)
            if grant:
                query = query.where(g.c.grant_id == bindparam("grant"))
            if metric:
                query = query.where(g.c.metric == bindparam("metric"))
            if since:
                query = query.where(g.c.consumed_at >= bindparam("since"))
            if key:
                query = query.where(g.c.effect_key == bindparam("key"))
            return query

        return self._cached(("consumptions", grant, metric, since, key), build)


class LedgerRows:
    """The ``Tx`` row operations of delegations and of the ledger, for ``SQLTx``."""

    sql: Any  # the transaction's Statements
    _run: Callable[..., Any]

    def _go(self, statement: Compiled, values: dict[str, Any]) -> Any:
        return self._run(statement.sql, statement.bind(values))

    # the budget ledger
    def lock_budgets(self, budgets: Sequence[tuple[str, str]]) -> None:
        lock = self.sql.ledger_sql.lock
        if lock is None:
            return  # the write transaction holds the database's one write lock already
        scope = self.sql.schema or ""
        for key in sorted({budget_lock_key(scope, grant, metric) for grant, metric in budgets}):
            self._run(lock.sql, (key,)).fetchall()

    def spent(self, windows: Sequence[tuple[str, str, datetime]]) -> list[int]:
        if not windows:
            return []
        statement = self.sql.ledger_sql.spent(len(windows))
        values: dict[str, Any] = {}
        for i, (grant, metric, since) in enumerate(windows):
            values.update({f"grant_{i}": grant, f"metric_{i}": metric,
                           f"since_{i}": codec.ts(since)})  # fmt: skip
        sums = dict(self._go(statement, values).fetchall())
        return [int(sums[i]) for i in range(len(windows))]

    def insert_consumptions(
        self, rows: Sequence[tuple[str, str, int]], effect_key: str, attempt: int, at: datetime
    ) -> None:
        if not rows:
            return
        statement = self.sql.ledger_sql.insert_consumptions(len(rows))
        values: dict[str, Any] = {}
        when = codec.ts(at)
        for i, row in enumerate(rows):
            values.update(zip((f"{n}_{i}" for n in _ADDED), (*row, effect_key, attempt, when)))
        self._go(statement, values)

    def release_consumptions(self, effect_key: str, at: datetime) -> None:
        self._go(self.sql.ledger_sql.release, {"key": effect_key, "at": codec.ts(at)})

    def consumptions(
        self, *, grant_id: str | None, metric: str | None, since: datetime | None,
        effect_key: str | None,
    ) -> list[Consumption]:  # fmt: skip
        statement = self.sql.ledger_sql.consumptions(
            grant_id is not None, metric is not None, since is not None, effect_key is not None
        )
        values = {"grant": grant_id, "metric": metric, "since": codec.ts(since), "key": effect_key}
        rows = self._go(statement, values).fetchall()
        return [consumption_from_row(dict(zip(LEDGER_FIELDS, r))) for r in rows]

    # delegations
    def delegation(self, delegation_id: str) -> DelegationRecord | None:
        row = self._run(self.sql.ledger_sql.delegation.sql, (delegation_id,)).fetchone()
        return None if row is None else delegation_from_row(dict(zip(DELEGATION_FIELDS, row)))

    def insert_delegation(self, record: DelegationRecord) -> bool:
        # RETURNING, not rowcount: a conflict returns no row on both dialects
        statement = self.sql.ledger_sql.insert_delegation
        return self._go(statement, delegation_to_row(record)).fetchone() is not None

    def list_delegations(
        self, *, include_revoked: bool, parent_id: str | None
    ) -> list[DelegationRecord]:
        statement = self.sql.ledger_sql.list_delegations(include_revoked, parent_id is not None)
        rows = self._go(statement, {"parent": parent_id}).fetchall()
        return [delegation_from_row(dict(zip(DELEGATION_FIELDS, r))) for r in rows]

    def revoke_delegation(self, delegation_id: str, by: str, at: datetime) -> bool:
        values = {"id": delegation_id, "at": codec.ts(at), "by": by}
        return bool(self._go(self.sql.ledger_sql.revoke, values).rowcount == 1)
