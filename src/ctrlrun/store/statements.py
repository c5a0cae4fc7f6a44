"""Every statement the SQL stores send, written once with SQLAlchemy Core and compiled once per
dialect and schema; ``Compiled`` is the text and the order of its parameters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    MetaData,
    cast,
    func,
    Table,
    Text,
    bindparam,
    column,
    exists,
    insert,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    update,
    values,
)
from sqlalchemy.sql.expression import ClauseElement

from ..errors import CTRLRunError
from .codec import EFFECT_FIELDS, FINISHED_FIELDS
from .schema import metadata
from .compiled import Compiled

__all__ = ["EFFECT_COLUMNS", "EVENT_COLUMNS", "RECEIPT_COLUMNS", "Compiled", "Statements"]

EFFECT_COLUMNS = tuple(c.name for c in metadata.tables["effects"].c)
EVENT_COLUMNS = tuple(c.name for c in metadata.tables["events"].c if c.name != "event_id")
RECEIPT_COLUMNS = tuple(c.name for c in metadata.tables["receipts"].c)
# an EventRow's order (drafts.py): the statements take event rows as they are
assert EVENT_COLUMNS == ("ts", "type", "action_id", "effect_key", "approval_id", "data_json")
APPROVAL_COLUMNS = tuple(c.name for c in metadata.tables["approvals"].c)
FINISH_COLUMNS = FINISHED_FIELDS  # what a finishing compare-and-set writes, in table order
FINISH_WHERE = ("w_key", "w_action", "w_state")
UPDATE_WHERE = ("w_key", "w_state", "w_action", "w_attempt")
EVENTS_PER_STATEMENT = 500  # 6 parameters a row: far below SQLite's and Postgres' limits
_ONE: Any = literal_column("1")  # written in the text: every bound parameter is a named slot
_UTF8: Any = literal_column("'UTF8'")
_HEX: Any = literal_column("'hex'")
_CACHED_ROWS = 16  # event statements kept compiled for the small batches a call sends


def _dialect(name: str) -> Any:
    """The dialect to compile for, with positional marks (``?`` or ``%s``)."""
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite.pysqlite import dialect as sqlite_dialect

        return sqlite_dialect(paramstyle="qmark")
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql.psycopg import dialect as pg_dialect

        return pg_dialect(paramstyle="format")  # type: ignore[no-untyped-call]
    raise CTRLRunError(f"no ctrlrun store for the {name} dialect")  # pragma: no cover


def _dialect_insert(name: str) -> Callable[..., Any]:
    """The dialect's ``INSERT`` (it has ``on_conflict_do_nothing``)."""
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    return pg_insert


def _binds(names: Sequence[str], suffix: str = "") -> dict[str, Any]:
    return {name: bindparam(name + suffix) for name in names}


class Statements:
    """The statements of one dialect and schema, compiled on first use and kept."""

    def __init__(self, dialect_name: str, schema: str | None) -> None:
        self.dialect = _dialect(dialect_name)
        self.name = dialect_name
        self.combines = dialect_name == "postgresql"  # data-modifying CTEs: one statement
        self.places = self.combines  # the server places receipts itself (needs sha256())
        self._insert = _dialect_insert(dialect_name)
        if schema is None:
            tables = dict(metadata.tables)
        else:
            copy = MetaData()
            tables = {n: t.to_metadata(copy, schema=schema) for n, t in metadata.tables.items()}
        self.effects: Table = tables["effects"]
        self.approvals: Table = tables["approvals"]
        self.events: Table = tables["events"]
        self.receipts: Table = tables["receipts"]
        self.chain: Table = tables["receipt_chain"]
        self.delegations: Table = tables["delegations"]
        self.ledger: Table = tables["budget_ledger"]
        self.tables = tables
        self.schema = schema
        self._ledger_sql: Any = None
        self._evidence_sql: Any = None
        self._cache: dict[Any, Compiled] = {}
        e, c = self.effects, self.chain
        cas = (e.c.effect_key == bindparam("w_key"), e.c.state == bindparam("w_state"),
               e.c.action_id == bindparam("w_action"))  # fmt: skip
        self.effect = self.compile(select(*e.c).where(e.c.effect_key == bindparam("key")))
        self.insert_effect = self.compile(self._insert_effect())
        self.update_effect = self.compile(
            update(e).where(*cas, e.c.attempt == bindparam("w_attempt"))
            .values(_binds(EFFECT_COLUMNS[1:]))
        )  # fmt: skip
        self.finish_effect = self.compile(self._finish_effect())
        # the hot statements take their values as tuples in these orders (see sqltx.py)
        assert self.insert_effect.names == EFFECT_COLUMNS == EFFECT_FIELDS
        assert self.update_effect.names == (*EFFECT_COLUMNS[1:], *UPDATE_WHERE)
        assert self.finish_effect.names == (*FINISH_COLUMNS, *FINISH_WHERE)
        self.advance_head = self.compile(
            update(c).where(c.c.id == _ONE).values(seq=c.c.seq + _ONE).returning(c.c.seq, c.c.hash)
        )
        self.insert_receipt = self.compile(self._insert_receipt(strict=False))
        self.set_head_hash = self.compile(
            update(c).where(c.c.id == _ONE).values(hash=bindparam("hash"))
        )
        self.head = self.compile(select(c.c.seq, c.c.hash).where(c.c.id == _ONE))
        # the head moved from a known (seq, hash): one statement where a move and a set are two
        self.move_head = self.compile(
            update(c).where(c.c.id == _ONE, c.c.seq == bindparam("w_seq"),
                            c.c.hash == bindparam("w_hash"))
            .values(seq=bindparam("seq"), hash=bindparam("hash"))
        )  # fmt: skip
        assert self.move_head.names == ("seq", "hash", "w_seq", "w_hash")
        self.place_receipt = self.place_receipt_strict = None
        if self.combines:
            self.place_receipt = self.compile(self._place_receipt(strict=False))
            self.place_receipt_strict = self.compile(self._place_receipt(strict=True))
        a = self.approvals
        self.approval = self.compile(select(*a.c).where(a.c.approval_id == bindparam("id")))
        self.insert_approval = self.compile(
            self._insert(a).values(_binds(APPROVAL_COLUMNS))
            .on_conflict_do_nothing(index_elements=["approval_id"]).returning(a.c.approval_id)
        )  # fmt: skip
        self.update_approval = self.compile(
            update(a).where(
                a.c.approval_id == bindparam("w_id"), a.c.status == bindparam("w_status"),
                a.c.approvers.is_not_distinct_from(bindparam("w_approvers", type_=Text)),
            ).values(_binds(APPROVAL_COLUMNS[1:]))
        )  # fmt: skip
        self.list_events = self.compile(select(*self.events.c).order_by(self.events.c.event_id))
        r = self.receipts
        self.stored_receipt = self.compile(
            select(r.c.json, r.c.hash).where(r.c.receipt_id == bindparam("id"))
        )
        self.list_receipts = self.compile(
            select(*r.c).order_by(r.c.seq.asc().nulls_first(), r.c.receipt_id)
        )

    @property
    def ledger_sql(self) -> Any:
        """The delegation and ledger statements (``LedgerStatements``), compiled on first use:
        a store that never charges nor delegates compiles none of them."""
        if self._ledger_sql is None:
            from .ledgersql import LedgerStatements

            self._ledger_sql = LedgerStatements(self)
        return self._ledger_sql

    @property
    def evidence_sql(self) -> Any:
        """The acts chain, holds and prune statements (``EvidenceStatements``), compiled on first use."""
        if self._evidence_sql is None:
            from .evidencesql import EvidenceStatements

            self._evidence_sql = EvidenceStatements(self)
        return self._evidence_sql

    def compile(self, statement: ClauseElement) -> Compiled:
        compiled: Any = statement.compile(dialect=self.dialect)
        names = tuple(compiled.positiontup or ())
        for name in names:  # a literal bound in passing would need its value carried along
            if compiled.binds[name].value is not None:
                raise CTRLRunError(f"statement parameter {name!r} is a literal: write it as text")
        columns = tuple(str(c[0]) for c in getattr(compiled, "_result_columns", ()) or ())
        return Compiled(compiled.string, names, columns)

    # -- effects

    def _insert_effect(self) -> Any:
        return (
            self._insert(self.effects).values(_binds(EFFECT_COLUMNS))
            .on_conflict_do_nothing(index_elements=["effect_key"])
        )  # fmt: skip

    def _finish_effect(self) -> Any:
        e = self.effects
        return (
            update(e).where(
                e.c.effect_key == bindparam("w_key"), e.c.action_id == bindparam("w_action"),
                e.c.state == bindparam("w_state"), e.c.result_json.is_(None), e.c.error.is_(None),
            ).values(_binds(FINISH_COLUMNS))
        )  # fmt: skip

    # -- approvals

    def find_approvals(
        self, by_hash: bool, by_status: bool, valid: bool, newest_first: bool, limited: bool
    ) -> Compiled:
        def build() -> Any:
            a = self.approvals
            query = select(*a.c)
            if by_hash:
                query = query.where(
                    or_(a.c.action_hash == bindparam("hash"),
                        a.c.edited_action_hash == bindparam("hash2"))
                )  # fmt: skip
            if by_status:
                query = query.where(a.c.status == bindparam("status"))
            if valid:
                query = query.where(a.c.expires_at >= bindparam("after"))
            order = (a.c.created_at, a.c.approval_id)
            query = query.order_by(*(c.desc() for c in order) if newest_first else order)
            if not limited:
                return query
            return query.limit(bindparam("limit")).offset(bindparam("offset"))

        return self._cached(("approvals", by_hash, by_status, valid, newest_first, limited), build)

    # -- events and receipts

    def _event_values(self, rows: int) -> list[dict[str, Any]]:
        return [_binds(EVENT_COLUMNS, f"_{i}") for i in range(rows)]

    def insert_events(self, rows: int, *, returning: bool, advance_head: bool = False) -> Compiled:
        """``rows`` events in one ``INSERT``, returning each row with its id (``returning``).

        ``advance_head`` (Postgres): the same statement also moves the chain head, in a
        data-modifying CTE, returned as one more row flagged ``1`` in a first column (event rows
        carry ``0``)."""

        def build() -> Any:
            v = self.events
            statement = insert(v).values(self._event_values(rows))
            if not returning:
                return statement
            statement = statement.returning(v.c.event_id, *(v.c[n] for n in EVENT_COLUMNS))
            if not advance_head:
                return statement
            added = statement.cte("added")
            moved = self._advance_head().cte("moved")
            return select(literal_column("0"), *added.c).union_all(
                select(literal_column("1"), moved.c.seq, moved.c.hash, *_nulls(5))
            )

        return self._cached(("events", rows, returning, advance_head), build)

    def _advance_head(self) -> Any:
        c = self.chain
        return update(c).where(c.c.id == _ONE).values(seq=c.c.seq + _ONE).returning(c.c.seq, c.c.hash)

    def reserve_new(self, rows: int) -> Compiled:
        """Postgres: the effect inserted and, only if it was, ``rows`` events, in one statement.
        Returns ``(1, NULL…)`` when the effect was inserted and ``(0, event_id, columns…)`` per
        event."""

        def build() -> Any:
            v = self.events
            reserved = self._insert_effect().returning(literal_column("1").label("one"))
            reserved = reserved.cte("reserved")
            given = values(*(column(n, Text) for n in EVENT_COLUMNS), name="given").data(
                [tuple(bindparam(f"{n}_{i}") for n in EVENT_COLUMNS) for i in range(rows)]
            )
            chosen = select(*given.c).where(exists(select(reserved.c.one)))
            added = (
                insert(v).from_select(list(EVENT_COLUMNS), chosen)
                .returning(v.c.event_id, *(v.c[n] for n in EVENT_COLUMNS)).cte("added")
            )  # fmt: skip
            return select(literal_column("0"), *added.c).union_all(
                select(literal_column("1"), *_nulls(7)).select_from(reserved)
            )

        return self._cached(("reserve", rows), build)

    def finish_and_advance(self, rows: int) -> Compiled:
        """Postgres: the outcome's compare-and-set, ``rows`` events and the chain head moved, in
        one statement. Returns ``(0, event_id, columns…)`` per event, ``(1, seq, hash, NULL…)``
        for the head and ``(2, NULL…)`` when the compare-and-set matched."""

        def build() -> Any:
            v = self.events
            finished = self._finish_effect().returning(literal_column("1").label("one"))
            finished = finished.cte("finished")
            added = (
                insert(v).values(self._event_values(rows))
                .returning(v.c.event_id, *(v.c[n] for n in EVENT_COLUMNS)).cte("added")
            )  # fmt: skip
            moved = self._advance_head().cte("moved")
            return select(literal_column("0"), *added.c).union_all(
                select(literal_column("1"), moved.c.seq, moved.c.hash, *_nulls(5)),
                select(literal_column("2"), *_nulls(7)).select_from(finished),
            )

        return self._cached(("finish", rows), build)

    def finish_and_place(self, rows: int, *, release: bool = False) -> Compiled:
        """Postgres: the whole *finish* in one statement, so it travels in one message and no
        lock outlives it: ``placed_after_head`` guarded by the outcome's compare-and-set. No
        row at all when that missed (nothing written). ``release`` (an outcome of ``failed``):
        the key's held charges are released too, under the same guard."""

        def build() -> Any:
            finished = self._finish_effect().returning(_ONE.label("one")).cte("finished")
            done = exists(select(finished.c.one))
            statement = self.placed_after_head(rows, done)
            if not release:
                return statement
            g = self.ledger
            released = (
                update(g).where(
                    g.c.effect_key == bindparam("w_key"), g.c.released_at.is_(None), done,
                ).values(released_at=bindparam("updated_at")).cte("released")
            )  # fmt: skip
            return statement.add_cte(released)

        return self._cached(("place", rows, release), build)

    def record_and_place(self, rows: int) -> Compiled:
        """Postgres: events and a receipt (no outcome) in one statement: ``placed_after_head``."""
        return self._cached(("record_place", rows), lambda: self.placed_after_head(rows))

    def placed_after_head(self, rows: int, done: Any = None) -> Any:
        """``rows`` events inserted and the receipt placed after the chain head (read ``FOR
        UPDATE``), its stored line and hash made by the server from the draft's pieces
        (``ReceiptDraft.pieces``), the head moved to it; all of it only where ``done`` holds.
        Returns ``(0, event_id, columns…)`` per event and ``(1, seq, hash, prev_hash, NULL…)``
        for the receipt."""
        c, r, v = self.chain, self.receipts, self.events
        guard = () if done is None else (done,)
        head = (
            select(c.c.seq, c.c.hash).where(c.c.id == _ONE, *guard).with_for_update()
            .cte("head")
        )  # fmt: skip
        seq = cast(head.c.seq + _ONE, Text)

        def piece(name: str) -> Any:
            return bindparam(name, type_=Text)

        doc = select(
            (head.c.seq + _ONE).label("seq"), head.c.hash.label("prev"),
            (piece("l0") + seq + piece("l1") + head.c.hash + piece("l2")).label("line"),
            (piece("c0") + head.c.hash + piece("c1") + seq + piece("c2")).label("canon"),
        ).cte("doc")  # fmt: skip
        digest = func.encode(func.sha256(func.convert_to(doc.c.canon, _UTF8)), _HEX)
        sealed = select(
            doc.c.seq, doc.c.prev, doc.c.line,
            (literal_column("'sha256:'", Text) + cast(digest, Text)).label("hash"),
        ).cte("sealed")  # fmt: skip
        moved = (
            update(c).where(c.c.id == _ONE).values(seq=sealed.c.seq, hash=sealed.c.hash)
            .returning(_ONE.label("one")).cte("moved")
        )  # fmt: skip
        placed = (
            insert(r).from_select(
                list(RECEIPT_COLUMNS),
                select(
                    piece("receipt_id"), piece("action_id"), piece("effect_key"),
                    piece("result"), sealed.c.line, piece("ts"), sealed.c.seq,
                    sealed.c.prev, sealed.c.hash, piece("approval_id"),
                ),
            ).returning(r.c.seq, r.c.hash, r.c.prev_hash).cte("placed")
        )  # fmt: skip
        receipt_row = select(
            literal_column("1"), placed.c.seq, placed.c.hash, placed.c.prev_hash, *_nulls(4)
        )
        if not rows:
            return receipt_row.add_cte(moved)
        given = values(*(column(n, Text) for n in EVENT_COLUMNS), name="given").data(
            [tuple(bindparam(f"{n}_{i}") for n in EVENT_COLUMNS) for i in range(rows)]
        )
        added = (
            insert(v).from_select(list(EVENT_COLUMNS), select(*given.c).where(*guard))
            .returning(v.c.event_id, *(v.c[n] for n in EVENT_COLUMNS)).cte("added")
        )  # fmt: skip
        return select(literal_column("0"), *added.c).union_all(receipt_row).add_cte(moved)

    def _insert_receipt(self, *, strict: bool) -> Any:
        statement = self._insert(self.receipts).values(_binds(RECEIPT_COLUMNS))
        return statement if strict else statement.on_conflict_do_nothing(
            index_elements=["receipt_id"]
        )  # fmt: skip

    def _place_receipt(self, *, strict: bool) -> Any:
        """The receipt inserted and the head given its hash, in one statement (Postgres); the
        head moves only for a row inserted. ``strict``: a taken id fails the statement."""
        c = self.chain
        placed = self._insert_receipt(strict=strict).returning(self.receipts.c.hash)
        placed = placed.cte("placed")
        return (
            update(c).where(c.c.id == _ONE).values(hash=placed.c.hash)
            .add_cte(placed)
        )  # fmt: skip

    # -- paged reads: each an index range, stopped at its page

    def receipts_page(self, chained: bool) -> Compiled:
        """A page of receipts: ``chained``, those with ``seq > :after`` by seq; else the
        unchained ones (no seq) with ``receipt_id > :after`` by id."""

        def build() -> Any:
            r = self.receipts
            if chained:
                query = select(*r.c).where(r.c.seq > bindparam("after")).order_by(r.c.seq)
            else:
                query = (
                    select(*r.c).where(r.c.seq.is_(None), r.c.receipt_id > bindparam("after"))
                    .order_by(r.c.receipt_id)
                )  # fmt: skip
            return _page(query)

        return self._cached(("receipts_page", chained), build)

    def receipts_tail(self, chained: bool) -> Compiled:
        """The last ``:limit`` receipts, newest first: by seq, or the unchained ones by id."""

        def build() -> Any:
            r = self.receipts
            if chained:
                query = select(*r.c).where(r.c.seq.is_not(None)).order_by(r.c.seq.desc())
            else:
                query = select(*r.c).where(r.c.seq.is_(None)).order_by(r.c.receipt_id.desc())
            return _page(query)

        return self._cached(("receipts_tail", chained), build)

    def receipt_at_or_after(self) -> Compiled:
        """``(seq, ts)`` of the first receipt with ``seq >= :seq``."""
        r = self.receipts
        return self._cached(("receipt_at", 0), lambda: (
            select(r.c.seq, r.c.ts).where(r.c.seq >= bindparam("seq")).order_by(r.c.seq).limit(_ONE).offset(literal_column("0"))
        ))  # fmt: skip

    def receipts_by(self, column_name: str) -> Compiled:
        """The receipts whose ``column_name`` is ``:value``, in chain order (by its index)."""
        r = self.receipts
        return self._cached(("receipts_by", 0, column_name), lambda: (
            select(*r.c).where(r.c[column_name] == bindparam("value"))
            .order_by(r.c.seq.asc().nulls_first(), r.c.receipt_id)
        ))  # fmt: skip

    def events_by(self, column_name: str) -> Compiled:
        """The events whose ``column_name`` is ``:value``, in id order (by its index)."""
        v = self.events
        return self._cached(("events_by", 0, column_name), lambda: (
            select(*v.c).where(v.c[column_name] == bindparam("value")).order_by(v.c.event_id)
        ))  # fmt: skip

    def effects_page(self, state: bool, low: bool, high: bool, after: bool) -> Compiled:
        """A page of effects in creation order: of ``:state``, keys in ``[:low, :high)``, after
        ``(:a_created, :a_key)``; ``:limit`` rows."""

        def build() -> Any:
            e = self.effects
            query = select(*e.c)
            if state:
                query = query.where(e.c.state == bindparam("state"))
            if low:
                query = query.where(e.c.effect_key >= bindparam("low"))
            if high:
                query = query.where(e.c.effect_key < bindparam("high"))
            if after:
                query = query.where(
                    tuple_(e.c.created_at, e.c.effect_key)
                    > tuple_(bindparam("a_created"), bindparam("a_key"))
                )
            query = query.order_by(e.c.created_at, e.c.effect_key)
            return _page(query)

        return self._cached(("effects_page", state, low, high, after), build)

    def _cached(self, key: Any, build: Callable[[], Any]) -> Compiled:
        found = self._cache.get(key)
        if found is None:
            found = self.compile(build())
            rows = key[1] if len(key) > 1 and isinstance(key[1], int) else 0
            if rows <= _CACHED_ROWS:
                self._cache[key] = found
        return found


def _page(query: Any) -> Any:
    """``LIMIT :limit`` (SQLite writes an OFFSET with every LIMIT: a literal zero here)."""
    return query.limit(bindparam("limit")).offset(literal_column("0"))


def _nulls(n: int) -> list[Any]:
    return [null() for _ in range(n)]
