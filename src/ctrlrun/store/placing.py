"""Postgres: a receipt placed by the server, in the one message that commits its write.

The allowed call's finish already travels whole (``Statements.finish_and_place``). Here the
same for every other write that moves the chain head: a ``Receipt`` object becomes a
``ReceiptDraft`` (its line and canonical text with slots for ``seq`` and ``prev_hash``), and a
write with no outcome to set (``record``, ``put_receipt``, a refusal's receipt) places it with its
events in one statement. The head row is locked only while the server runs that message, never
across a round trip to this host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, bindparam, cast, column, func, insert, literal_column, select, update
from sqlalchemy import values as value_rows

from ..drafts import EventRow, ReceiptDraft
from ..errors import InvalidArgument
from ..receipt import _COMPACT_JSON, Receipt, _canonical, _compact
from ..action import _CANONICAL_JSON
from . import codec
from .statements import EVENT_COLUMNS, RECEIPT_COLUMNS, Compiled, Statements

__all__ = ["as_draft", "place_with_events", "record_and_place"]

# stand-ins for seq and prev_hash while the document is written: no stored text holds a NUL
_SEQ = "\x00ctrlrun seq\x00"
_PREV = "\x00ctrlrun prev_hash\x00"
_ONE: Any = literal_column("1")
_UTF8: Any = literal_column("'UTF8'")
_HEX: Any = literal_column("'hex'")


def _slots(text: str, encoder: Any) -> str | None:
    """``text`` as a ``%``-format with ``%(seq)s`` and ``%(prev_hash)s`` where the stand-ins
    are; ``None`` unless each stand-in occurs exactly once."""
    seq, prev = encoder.encode(_SEQ), encoder.encode(_PREV)
    if text.count(seq) != 1 or text.count(prev) != 1:
        return None
    return text.replace("%", "%%").replace(seq, "%(seq)s").replace(prev, "%(prev_hash)s")


def as_draft(receipt: Receipt) -> ReceiptDraft | None:
    """The draft of an unplaced ``receipt``: placed at ``(seq, prev_hash)`` it gives byte for
    byte ``receipt.chained(seq, prev_hash)``'s line and hash. ``None`` when the document cannot
    be cut that way (the caller then places it the two-step way)."""
    receipt_id = codec._text(receipt.receipt_id, "receipt_id")
    free = [codec._free_text(getattr(receipt, name), f"receipt {name}")
            for name in ("action_id", "effect_key", "result", "finished_at")]  # fmt: skip
    document, unchecked = receipt._document()
    document["seq"], document["prev_hash"] = _SEQ, _PREV
    line = _compact(document)  # the stand-ins are written escaped: no NUL in the text
    codec._text(line, f"receipt {receipt.receipt_id}")
    canonical = _canonical(document, unchecked).decode("utf-8")
    formats = (_slots(line, _COMPACT_JSON), _slots(canonical, _CANONICAL_JSON))
    if formats[0] is None or formats[1] is None:
        return None
    action_id, effect_key, result, finished_at = free
    draft = ReceiptDraft(
        {}, (formats[0], formats[1]), receipt_id=str(receipt_id), action_id=str(action_id),
        effect_key=effect_key, result=str(result), finished_at=str(finished_at),
    )  # fmt: skip
    try:
        draft.pieces()  # seq before prev_hash in the line, after it in the canonical text
    except ValueError:
        return None
    return draft


def placed_receipt(receipt: Receipt, draft: ReceiptDraft) -> Receipt:
    """``receipt`` as the server placed its ``draft``."""
    seq, prev_hash = int(draft.values["seq"]), draft.values["prev_hash"][1:-1]
    placed = receipt.chained(seq, prev_hash)
    if placed.hash != draft.hash:  # pragma: no cover - the draft is cut from the same text
        raise InvalidArgument(f"receipt {receipt.receipt_id} did not place as drafted")
    object.__setattr__(placed, "_json", draft.line)  # to_json() of this receipt, for the sinks
    return placed


def record_and_place(statements: Statements, rows: int) -> Compiled:
    """``rows`` events inserted and the receipt placed after the chain head (read ``FOR
    UPDATE``), its line and hash made by the server from the draft's pieces, the head moved to
    it: one statement. Returns ``(0, event_id, columns…)`` per event and ``(1, seq, hash,
    prev_hash, NULL…)`` for the receipt."""

    def build() -> Any:
        c, r, v = statements.chain, statements.receipts, statements.events
        head = select(c.c.seq, c.c.hash).where(c.c.id == _ONE).with_for_update().cte("head")
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
                    piece("result"), sealed.c.line, piece("ts"), sealed.c.seq, sealed.c.prev,
                    sealed.c.hash,
                ),
            ).returning(r.c.seq, r.c.hash, r.c.prev_hash).cte("placed")
        )  # fmt: skip
        receipt_row = select(
            literal_column("1"), placed.c.seq, placed.c.hash, placed.c.prev_hash,
            *[literal_column("NULL") for _ in range(4)],
        )  # fmt: skip
        if not rows:
            return receipt_row.add_cte(moved)
        given = value_rows(*(column(n, Text) for n in EVENT_COLUMNS), name="given").data(
            [tuple(bindparam(f"{n}_{i}") for n in EVENT_COLUMNS) for i in range(rows)]
        )
        added = (
            insert(v).from_select(list(EVENT_COLUMNS), select(*given.c))
            .returning(v.c.event_id, *(v.c[n] for n in EVENT_COLUMNS)).cte("added")
        )  # fmt: skip
        return select(literal_column("0"), *added.c).union_all(receipt_row).add_cte(moved)

    return statements._cached(("record_place", rows), build)


def place_with_events(
    tx: Any, rows: Sequence[EventRow], draft: ReceiptDraft
) -> Sequence[int]:
    """Run ``record_and_place`` with the transaction's ``COMMIT`` (``tx`` a ``SQLTx`` that
    places receipts): the events' ids; ``draft`` comes back placed. A taken receipt id writes
    nothing and is refused."""
    from .sqltx import _constraint, _event_binds, _match_ids

    statement = record_and_place(tx.sql, len(rows))
    values: dict[str, Any] = dict(zip(("l0", "l1", "l2", "c0", "c1", "c2"), draft.pieces()))
    values.update(_event_binds(rows))
    values.update(receipt_id=draft.receipt_id, action_id=draft.action_id,
                  effect_key=draft.effect_key, result=draft.result,
                  ts=draft.finished_at)  # fmt: skip
    try:
        returned = tx._commits(statement.sql, statement.bind(values)).fetchall()
    except tx._unique_error as exc:
        if _constraint(exc) == "receipts_pkey":
            raise InvalidArgument(
                f"receipt {draft.receipt_id} is already stored; a receipt is written once"
            ) from None
        raise
    (placed,) = [r for r in returned if r[0] == 1]
    _, seq, digest, prev = placed[:4]
    draft.place(int(seq), prev)
    if draft.hash != digest:  # pragma: no cover - the two encoders agree by test
        raise InvalidArgument(
            f"receipt {draft.receipt_id} hashes to {draft.hash} here but {digest} in the "
            "store; run `ctrlrun receipts --verify-chain`"
        )
    if not tx.returning or not rows:
        return ()
    return _match_ids(rows, [r[1:] for r in returned if r[0] == 0])
