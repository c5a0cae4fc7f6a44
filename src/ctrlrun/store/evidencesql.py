"""The SQL stores' evidence rows (the acts chain, holds, the prune checkpoint, the anchors note):
their statements, written once with SQLAlchemy Core and compiled per dialect and schema, and
the ``Tx`` row operations that send them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Table, bindparam, delete, literal_column, or_, select, update
from sqlalchemy.sql.expression import ClauseElement

from ..evidence.retention import Checkpoint, Hold
from .compiled import Compiled

__all__ = ["EvidenceRows", "EvidenceStatements"]

_ONE: Any = literal_column("1")
_ZERO: Any = literal_column("0")
_HOLD_FIELDS = ("hold_id", "from_seq", "to_seq", "reason", "placed_by", "placed_at", "released_by", "released_at")


def _states(*names: str) -> tuple[Any, ...]:
    return tuple(literal_column(f"'{n}'") for n in names)


def _page(query: Any) -> Any:
    return query.limit(bindparam("limit")).offset(_ZERO)


class EvidenceStatements:
    """The evidence tables' statements, compiled on first use by the owning ``Statements``."""

    def __init__(self, statements: Any) -> None:
        self._s = statements
        t = statements.tables
        self.acts: Table = t["acts"]
        self.chain: Table = t["acts_chain"]
        self.legacy_t: Table = t["acts_legacy"]
        self.ckpt: Table = t["prune_checkpoint"]
        self.holds_t: Table = t["holds"]
        self.anchors: Table = t["anchors"]
        r: Table = statements.receipts
        e: Table = statements.effects
        a: Table = statements.approvals
        g: Table = statements.ledger
        compile: Callable[[ClauseElement], Compiled] = statements.compile
        ins = statements._insert
        acts, chain, ckpt, holds = self.acts, self.chain, self.ckpt, self.holds_t
        self.advance = compile(
            update(chain).where(chain.c.id == _ONE).values(seq=chain.c.seq + _ONE)
            .returning(chain.c.seq, chain.c.hash)
        )  # fmt: skip
        self.insert_act = compile(
            acts.insert().values({n: bindparam(n) for n in ("seq", "kind", "subject", "json", "hash")})
        )
        self.set_acts_hash = compile(update(chain).where(chain.c.id == _ONE).values(hash=bindparam("hash")))
        self.acts_head = compile(select(chain.c.seq, chain.c.hash, chain.c.covers_from).where(chain.c.id == _ONE))
        self.acts_page = compile(
            _page(select(acts.c.seq, acts.c.json, acts.c.hash).where(acts.c.seq > bindparam("after")).order_by(acts.c.seq))
        )
        self.act_at = compile(select(acts.c.json, acts.c.hash).where(acts.c.seq == bindparam("seq")))
        self.legacy = compile(select(*self.legacy_t.c))
        self.checkpoint = compile(select(ckpt.c.seq, ckpt.c.hash, ckpt.c.schema, ckpt.c.at).where(ckpt.c.id == _ONE))
        values: dict[str, Any] = {n: bindparam(n) for n in ("seq", "hash", "schema", "at")}
        self.set_checkpoint = compile(
            ins(ckpt).values(id=_ONE, **values).inline()  # inline: no implicit RETURNING to read
            .on_conflict_do_update(index_elements=["id"], set_=values)
        )  # fmt: skip
        self.holds = compile(select(*holds.c).order_by(holds.c.placed_at, holds.c.hold_id))
        self.insert_hold = compile(
            ins(holds).values({n: bindparam(n) for n in _HOLD_FIELDS})
            .on_conflict_do_nothing(index_elements=["hold_id"]).returning(holds.c.hold_id)
        )  # fmt: skip
        self.release_hold = compile(
            update(holds).where(holds.c.hold_id == bindparam("id"), holds.c.released_at.is_(None))
            .values(released_by=bindparam("by"), released_at=bindparam("at"))
        )  # fmt: skip
        self.note_anchor = compile(
            self.anchors.insert().values({n: bindparam(n) for n in ("kind", "seq", "hash", "token", "at")}).inline()
        )
        self.receipt_at = compile(
            select(r.c.receipt_id, r.c.json, r.c.prev_hash, r.c.hash).where(r.c.seq == bindparam("seq"))
        )
        self.batch = compile(
            _page(select(r.c.seq, r.c.hash).where(r.c.seq <= bindparam("through")).order_by(r.c.seq))
        )
        self.delete_through = compile(delete(r).where(r.c.seq <= bindparam("through")))
        span = (r.c.seq >= bindparam("low"), r.c.seq <= bindparam("high"))
        self.unsettled = compile(
            select(r.c.seq, r.c.effect_key, e.c.state).join_from(r, e, e.c.effect_key == r.c.effect_key)
            .where(*span, e.c.state.in_(_states("reserved", "executing", "ambiguous")))
            .order_by(r.c.seq).limit(_ONE).offset(_ZERO)
        )  # fmt: skip
        self.pending = compile(
            select(r.c.seq, r.c.approval_id).join_from(r, a, a.c.approval_id == r.c.approval_id)
            .where(*span, a.c.status == literal_column("'pending'"), a.c.expires_at >= bindparam("now"))
            .order_by(r.c.seq).limit(_ONE).offset(_ZERO)
        )  # fmt: skip
        self.recent_charge = compile(
            select(r.c.seq, r.c.effect_key, g.c.consumed_at).join_from(r, g, g.c.effect_key == r.c.effect_key)
            .where(*span, g.c.released_at.is_(None), g.c.consumed_at >= bindparam("since"))
            .order_by(r.c.seq).limit(_ONE).offset(_ZERO)
        )  # fmt: skip
        self.approval_receipts = compile(
            _page(select(r.c.seq, r.c.json).where(
                r.c.approval_id.is_not(None), r.c.seq > bindparam("after"), r.c.seq <= bindparam("through"),
            ).order_by(r.c.seq))
        )  # fmt: skip
        self._resolved: dict[bool, Compiled] = {}

    def resolved(self, since: bool) -> Compiled:
        """A page of effects that read as resolved, by key, each with its last receipt's seq and
        result; ``since``: only keys a receipt after ``:since`` names."""
        found = self._resolved.get(since)
        if found is None:
            s = self._s
            e, r = s.effects, s.receipts
            # The key's newest receipt, one probe of the (effect_key, seq) index. Said as a range
            # and ordered by both columns on purpose: with ``effect_key = …`` ordered by seq alone,
            # Postgres may walk the whole seq index backwards looking for the key.
            newest = (r.c.effect_key >= e.c.effect_key, r.c.effect_key <= e.c.effect_key, r.c.seq.is_not(None))
            order = (r.c.effect_key.desc(), r.c.seq.desc())
            last = select(r.c.seq).where(*newest).order_by(*order).limit(_ONE).offset(_ZERO)
            result = select(r.c.result).where(*newest).order_by(*order).limit(_ONE).offset(_ZERO)
            query = select(
                e.c.effect_key, e.c.attempt, e.c.resolved_by, e.c.state,
                last.scalar_subquery(), result.scalar_subquery(),
            ).where(
                e.c.effect_key > bindparam("after"),
                or_(e.c.resolved_by.is_not(None), e.c.state.in_(_states("committed", "failed"))),
            ).order_by(e.c.effect_key)  # fmt: skip
            if since:
                query = query.where(e.c.effect_key.in_(select(r.c.effect_key).where(r.c.seq > bindparam("since"))))
            found = self._resolved[since] = s.compile(_page(query))
        return found

    def acts_about(self, subjects: int) -> Compiled:
        def build() -> Any:
            acts = self.acts
            names: list[Any] = [bindparam(f"s_{i}") for i in range(subjects)]
            return select(acts.c.seq, acts.c.json, acts.c.hash).where(acts.c.subject.in_(names)).order_by(acts.c.seq)

        return self._s._cached(("acts_about", subjects), build)  # type: ignore[no-any-return]


class EvidenceRows:
    """The ``Tx`` row operations of the evidence tables, for ``SQLTx``."""

    sql: Any
    _run: Callable[..., Any]

    def _ev(self, name: str, values: dict[str, Any]) -> Any:
        statement: Compiled = getattr(self.sql.evidence_sql, name)
        return self._run(statement.sql, statement.bind(values))

    # the acts chain
    def advance_acts(self) -> tuple[int, str] | None:
        rows = self._ev("advance", {}).fetchall()  # RETURNING: read to the end, or SQLite cannot commit
        return None if not rows else (int(rows[0][0]), str(rows[0][1]))

    def insert_act(self, seq: int, kind: str, subject: str, text: str, hash: str) -> None:
        self._ev("insert_act", {"seq": seq, "kind": kind, "subject": subject, "json": text, "hash": hash})
        self._ev("set_acts_hash", {"hash": hash})

    def acts_head(self) -> tuple[int, str, int] | None:
        row = self._ev("acts_head", {}).fetchone()
        return None if row is None else (int(row[0]), str(row[1]), int(row[2]))

    def acts_page(self, after: int, limit: int) -> list[tuple[int, str, str]]:
        return [(int(s), j, h) for s, j, h in self._ev("acts_page", {"after": after, "limit": limit}).fetchall()]

    def act_at(self, seq: int) -> tuple[str, str] | None:
        row = self._ev("act_at", {"seq": seq}).fetchone()
        return None if row is None else (row[0], row[1])

    def acts_about(self, subjects: Sequence[str]) -> list[tuple[int, str, str]]:
        if not subjects:
            return []
        statement = self.sql.evidence_sql.acts_about(len(subjects))
        values = {f"s_{i}": s for i, s in enumerate(subjects)}
        return [(int(s), j, h) for s, j, h in self._run(statement.sql, statement.bind(values)).fetchall()]

    def acts_legacy(self) -> list[tuple[str, str, int]]:
        return [(k, s, int(a)) for k, s, a in self._ev("legacy", {}).fetchall()]

    # the checkpoint and the holds
    def checkpoint(self) -> Checkpoint | None:
        row = self._ev("checkpoint", {}).fetchone()
        return None if row is None else Checkpoint(int(row[0]), row[1], row[2], row[3])

    def set_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._ev("set_checkpoint", checkpoint.to_dict())

    def holds(self) -> list[Hold]:
        return [Hold(*row) for row in self._ev("holds", {}).fetchall()]

    def insert_hold(self, hold: Hold) -> bool:
        values = {n: getattr(hold, n) for n in _HOLD_FIELDS}
        return bool(self._ev("insert_hold", values).fetchall())

    def release_hold(self, hold_id: str, by: str, at: str) -> bool:
        return bool(self._ev("release_hold", {"id": hold_id, "by": by, "at": at}).rowcount == 1)

    def note_anchor(self, kind: str, seq: int, hash: str, token: str, at: str) -> None:
        self._ev("note_anchor", {"kind": kind, "seq": seq, "hash": hash, "token": token, "at": at})

    # the receipts a prune reads and deletes
    def receipt_at(self, seq: int) -> tuple[str, str, str, str] | None:
        row = self._ev("receipt_at", {"seq": seq}).fetchone()
        return None if row is None else (row[0], row[1], row[2], row[3])

    def delete_batch(self, through: int, limit: int) -> tuple[int, int, str] | None:
        rows = self._ev("batch", {"through": through, "limit": limit}).fetchall()
        if not rows:
            return None
        last, hash = int(rows[-1][0]), str(rows[-1][1])
        deleted = self._ev("delete_through", {"through": last}).rowcount
        return int(deleted), last, hash

    def prune_blocker(self, name: str, low: int, high: int, **values: Any) -> tuple[Any, ...] | None:
        row = self._ev(name, {"low": low, "high": high, **values}).fetchone()
        return None if row is None else tuple(row)

    def approval_receipts(self, after: int, through: int, limit: int) -> list[tuple[int, str]]:
        values = {"after": after, "through": through, "limit": limit}
        return [(int(s), j) for s, j in self._ev("approval_receipts", values).fetchall()]

    def resolved_effects(self, after: str, limit: int, since: int | None) -> list[tuple[Any, ...]]:
        statement = self.sql.evidence_sql.resolved(since is not None)
        values = {"after": after, "limit": limit, "since": since}
        return [tuple(row) for row in self._run(statement.sql, statement.bind(values)).fetchall()]
