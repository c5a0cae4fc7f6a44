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

from ..evidence.drafts import EventRow, ReceiptDraft, writer
from ..errors import InvalidArgument
from ..evidence.receipt import _COMPACT_JSON, Receipt, _canonical, _compact
from ..action import _CANONICAL_JSON
from . import codec

__all__ = ["as_draft", "place_with_events"]

# stand-ins for seq and prev_hash while the document is written: no stored text holds a NUL
_SEQ = "\x00ctrlrun seq\x00"
_PREV = "\x00ctrlrun prev_hash\x00"


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
            for name in ("action_id", "effect_key", "result", "finished_at", "approval_id")]  # fmt: skip
    document, unchecked = receipt._document()
    document["seq"], document["prev_hash"] = _SEQ, _PREV
    line = _compact(document)  # the stand-ins are written escaped: no NUL in the text
    codec._text(line, f"receipt {receipt.receipt_id}")
    canonical = _canonical(document, unchecked).decode("utf-8")
    formats = (_slots(line, _COMPACT_JSON), _slots(canonical, _CANONICAL_JSON))
    if formats[0] is None or formats[1] is None:
        return None
    action_id, effect_key, result, finished_at, approval_id = free
    draft = ReceiptDraft(
        {}, (writer(formats[0]), writer(formats[1])), receipt_id=str(receipt_id), action_id=str(action_id),
        effect_key=effect_key, result=str(result), finished_at=str(finished_at),
        approval_id=approval_id,
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


def place_with_events(
    tx: Any, rows: Sequence[EventRow], draft: ReceiptDraft
) -> Sequence[int]:
    """Run ``Statements.record_and_place`` with the transaction's ``COMMIT`` (``tx`` a ``SQLTx`` that
    places receipts): the events' ids; ``draft`` comes back placed. A taken receipt id writes
    nothing and is refused."""
    from .sqltx import _constraint, _event_binds, _match_ids

    statement = tx.sql.record_and_place(len(rows))
    values: dict[str, Any] = dict(zip(("l0", "l1", "l2", "c0", "c1", "c2"), draft.pieces()))
    values.update(_event_binds(rows))
    values.update(receipt_id=draft.receipt_id, action_id=draft.action_id,
                  effect_key=draft.effect_key, result=draft.result,
                  ts=draft.finished_at, approval_id=draft.approval_id)  # fmt: skip
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
