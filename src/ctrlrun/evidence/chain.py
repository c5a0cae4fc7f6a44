"""The receipt chain check: walk the receipts in stored ``seq`` order, in constant memory, and
name every break (a full walk, or an incremental one from a verified mark)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..action import _CANONICAL_JSON
from .receipt import (
    GENESIS_HASH,
    RECEIPT_SCHEMA_V7,
    _DOCUMENT_KEYS,
    _NOT_STORED,
    Receipt,
    UnreadableReceipt,
    receipt_from_row,
)

__all__ = ["BREAKS_KEPT", "ChainBreak", "ChainReport", "ChainWalk", "StoredRow", "row_position", "verify_rows", "walk_snapshot"]

#: how many breaks a report lists; the rest are counted in ``ChainReport.more_breaks``
BREAKS_KEPT = 100


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """One place where the chain does not verify."""

    name: str
    seq: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seq": self.seq, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What ``verify_chain`` found, and the range it covered (``from_seq``..``to_seq``)."""

    verified: int
    chained: int
    unchained: int
    head_seq: int | None
    head_hash: str | None
    breaks: tuple[ChainBreak, ...]
    check: str = "full"
    from_seq: int = 1
    to_seq: int = 0
    pruned_through: int | None = None
    more_breaks: int = 0  # found beyond the first ``BREAKS_KEPT``
    acts_verified: int = 0
    acts_head_seq: int | None = None
    acts_head_hash: str | None = None
    not_covered: int | None = None  # receipts 1..this predate the acts chain: not cross-checked

    @property
    def ok(self) -> bool:
        return not self.breaks

    @property
    def break_count(self) -> int:
        """Every break found, listed or not."""
        return len(self.breaks) + self.more_breaks

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "chained": self.chained,
            "unchained": self.unchained,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "breaks": [b.to_dict() for b in self.breaks],
            "more_breaks": self.more_breaks,
            "check": self.check,
            "from_seq": self.from_seq,
            "to_seq": self.to_seq,
            "pruned_through": self.pruned_through,
            "acts_verified": self.acts_verified,
            "acts_head_seq": self.acts_head_seq,
            "acts_head_hash": self.acts_head_hash,
            "not_covered": self.not_covered,
        }


_SENTINEL = "<unverifiable>"


def row_position(row: Receipt | UnreadableReceipt) -> int | None:
    """Where a row sits in the chain: its stored ``seq`` column when it came from a store."""
    if isinstance(row, Receipt) and row.stored_seq != _NOT_STORED:
        return row.stored_seq
    return row.seq


# ---------------------------------------------------------------- the stored line's hash, fast

class _Refused(Exception):
    pass


def _refuse(text: str) -> Any:
    raise _Refused


# JSON without floats (or NaN/Infinity): a document holding one has no canonical form
_PLAIN_JSON = json.JSONDecoder(parse_float=_refuse, parse_constant=_refuse)
_scan: Callable[[str, int], tuple[Any, int]] = getattr(_PLAIN_JSON, "scan_once")  # decode() minus whitespace


def _plain_encoder() -> Any:
    """The canonical encoding of a decoded document (acyclic by construction, so without the
    circular-reference markers), built once; ``None`` where there is no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    c = _CANONICAL_JSON
    return make(None, c.default, json.encoder.encode_basestring, None, c.key_separator,
                c.item_separator, c.sort_keys, c.skipkeys, c.allow_nan)  # fmt: skip


_ENCODE_PLAIN = _plain_encoder()
_V8_KEYS = frozenset(_DOCUMENT_KEYS)
_V7_KEYS = frozenset(_DOCUMENT_KEYS[:34])
_V8_ONLY = _V8_KEYS - _V7_KEYS
_LIST_KEYS = ("controls", "approvers", "budget_charges")


def _plain_document(text: Any) -> dict[str, Any] | None:
    """The stored JSON text as a document whose canonical bytes are exactly those
    ``Receipt.from_json(text).chain_hash()`` hashes, or ``None`` when that is not certain.

    It is certain when every key the receipt reads is present (no default filled in), its
    three list keys hold lists (``from_dict`` makes tuples of anything else), a v7 document has
    no v8 key (v7 hashes 34 keys) and nothing is a float: then the receipt's document is this
    one, key for key and value for value.
    """
    if type(text) is not str or not text.startswith("{"):
        return None
    try:
        document, end = _scan(text, 0)
    except (_Refused, ValueError, RecursionError, StopIteration):
        return None
    if end != len(text) or type(document) is not dict:
        return None
    keys = document.keys()
    if document.get("schema") == RECEIPT_SCHEMA_V7:
        if not keys >= _V7_KEYS or not keys.isdisjoint(_V8_ONLY):
            return None
    elif not keys >= _V8_KEYS:
        return None
    for name in _LIST_KEYS:
        if type(document[name]) is not list:
            return None
    return document


def _decoded(seq: int | None, receipt_id: Any, text: Any, stored: Any) -> Receipt | UnreadableReceipt:
    """The row through the receipt decoder (the slow, general path)."""
    return receipt_from_row({"seq": seq, "receipt_id": receipt_id, "json": text, "hash": stored})


_Hashed = tuple[str | None, Any, Any, str]  # (recomputed hash or None, receipt_id, prev_hash, why not)


def _hash_of(row: Receipt | UnreadableReceipt) -> _Hashed:
    if isinstance(row, UnreadableReceipt):
        return None, row.receipt_id, None, f"the stored receipt cannot be read: {row.error}"
    try:
        recomputed = row.chain_hash()
    except Exception as exc:  # a document with no canonical form
        return None, row.receipt_id, row.prev_hash, f"the receipt has no canonical form: {exc}"
    return recomputed, row.receipt_id, row.prev_hash, ""


def _rehash(seq: int, receipt_id: Any, text: Any, stored: Any) -> _Hashed:
    """A stored row's hash, straight from its JSON text when that is the receipt's own document
    (see ``_plain_document``), else through the decoder."""
    document = _plain_document(text)
    if document is not None:
        try:
            if _ENCODE_PLAIN is None:
                canonical = _CANONICAL_JSON.encode(document).encode("utf-8")
            else:
                canonical = "".join(_ENCODE_PLAIN(document, 0)).encode("utf-8")
        except (UnicodeEncodeError, ValueError, RecursionError):
            pass
        else:
            digest = "sha256:" + hashlib.sha256(canonical).hexdigest()
            return digest, document["receipt_id"], document["prev_hash"], ""
    return _hash_of(_decoded(seq, receipt_id, text, stored))


# ---------------------------------------------------------------- the walk


class ChainWalk:
    """The chain check's state, fed one row at a time in stored ``seq`` order: the previous
    hash, counters and the first ``BREAKS_KEPT`` breaks, nothing per row.

    A row whose ``seq`` is below the one expected (out of order, or repeated) is a
    ``link_broken`` at its ``seq``; it is checked for its own content but moves nothing.
    """

    def __init__(self) -> None:
        self.expected_seq = 1
        self.expected_prev = GENESIS_HASH
        self.last_seq, self.last_hash = 0, GENESIS_HASH
        self.verified = 0
        self.chained = 0
        self.unchained = 0
        self._breaks: list[ChainBreak] = []
        self._more = 0

    def _break(self, name: str, seq: int | None, detail: str) -> None:
        if len(self._breaks) < BREAKS_KEPT:
            self._breaks.append(ChainBreak(name, seq, detail))
        else:
            self._more += 1

    # -- feeding rows

    def add(self, row: Receipt | UnreadableReceipt) -> None:
        """One row as a store returns it (``Receipt`` or ``UnreadableReceipt``)."""
        seq = row_position(row)
        if seq is None:
            self.unchained += 1
            return
        self._row(seq, _hash_of(row), row.hash)

    def add_stored(self, seq: int | None, receipt_id: Any, text: Any, stored: Any) -> None:
        """One stored row's columns (``seq``, ``receipt_id``, ``json``, ``hash``)."""
        if seq is None:
            self.unchained += 1
            return
        self._row(seq, _rehash(seq, receipt_id, text, stored), stored)

    def add_unchained(self, count: int) -> None:
        """Rows without ``seq``, counted where they are (a store counts them by index)."""
        self.unchained += count

    # -- one row's checks

    def _arrives(self, seq: int) -> bool:
        """Whether the row is in order; a gap before it is ``missing``."""
        if seq < self.expected_seq:
            self._break(
                "link_broken", seq,
                f"seq {seq} comes after seq {self.expected_seq - 1}: the rows are out of seq order",
            )  # fmt: skip
            return False
        if seq != self.expected_seq:
            expected = self.expected_seq
            gap = f"seq {expected}" if seq == expected + 1 else f"seq {expected}..{seq - 1}"
            self._break("missing", expected, f"{gap} is not in the store")
            self.expected_seq = seq
        return True

    def _against_stored(self, seq: int, receipt_id: Any, recomputed: str, stored: Any) -> bool:
        """The recomputed hash against the row's stored one; False after naming a break."""
        if not stored:
            self._break("hash_missing", seq, "the stored hash is empty")
        elif recomputed != stored:
            self._break("content_altered", seq, f"receipt {receipt_id} hashes to {recomputed}, stored {stored}")
        else:
            return True
        return False

    def _row(self, seq: int, hashed: _Hashed, stored: Any) -> None:
        recomputed, receipt_id, prev_hash, problem = hashed
        self.chained += 1
        before = len(self._breaks) + self._more
        in_order = self._arrives(seq)
        if recomputed is None:
            self._break("content_altered", seq, problem)
        else:
            self._against_stored(seq, receipt_id, recomputed, stored)
            if in_order and prev_hash != self.expected_prev:
                self._break(
                    "link_broken", seq,
                    f"receipt {receipt_id} points back to {prev_hash}, expected {self.expected_prev}",
                )  # fmt: skip
            if len(self._breaks) + self._more == before:
                self.verified += 1
        if in_order:
            self.expected_prev = self.last_hash = recomputed or _SENTINEL
            self.last_seq = seq
            self.expected_seq += 1

    def start_at_mark(self, mark: tuple[int, str], row: tuple[Any, Any, Any] | None) -> None:
        """An incremental walk's first row: the receipt at the mark ``(seq, hash)`` must still
        hash to the mark; ``row`` is its ``(receipt_id, json, hash)`` columns, ``None`` if gone."""
        seq, hash = mark
        self.chained += 1
        recomputed: str | None = None
        if row is None:
            self._break("content_altered", seq, f"the receipt at the verified mark (seq {seq}) is gone")
        else:
            receipt_id, text, stored = row
            recomputed, receipt_id, _, problem = _rehash(seq, receipt_id, text, stored)
            if recomputed is None:
                self._break("content_altered", seq, problem)
            elif recomputed != hash:
                self._break(
                    "content_altered", seq,
                    f"the receipt at the verified mark (seq {seq}) hashes to {recomputed}, "
                    f"the mark records {hash}",
                )  # fmt: skip
            elif self._against_stored(seq, receipt_id, recomputed, stored):
                self.verified += 1
        self.expected_prev = self.last_hash = recomputed or _SENTINEL
        self.last_seq, self.expected_seq = seq, seq + 1

    def start_at_checkpoint(self, seq: int, hash: str) -> None:
        """A pruned chain: the first kept receipt must point back to the checkpoint's hash."""
        self.expected_prev = self.last_hash = hash
        self.last_seq, self.expected_seq = seq, seq + 1

    # -- the end

    def report(
        self, head: tuple[int, str] | None, *, check: str = "full", from_seq: int = 1,
        pruned_through: int | None = None,
    ) -> ChainReport:  # fmt: skip
        """The report, once every row was fed, against the chain head read before them."""
        ahead: list[ChainBreak] = []
        if self.unchained:
            ahead.append(
                ChainBreak("unchained", None, f"{self.unchained} receipt(s) have no chain position")
            )
        behind: list[ChainBreak] = []
        if head is None:
            behind.append(ChainBreak("head_mismatch", None, "the chain head row is missing"))
            head_seq, head_hash = None, None
        else:
            head_seq, head_hash = head
            if (head_seq, head_hash) != (self.last_seq, self.last_hash):
                behind.append(
                    ChainBreak(
                        "head_mismatch",
                        head_seq,
                        f"the head records seq {head_seq} {head_hash}, "
                        f"the receipts end at seq {self.last_seq} {self.last_hash}",
                    )
                )
        every = [*ahead, *self._breaks, *behind]
        more = self._more + max(0, len(every) - BREAKS_KEPT)
        return ChainReport(
            verified=self.verified,
            chained=self.chained,
            unchained=self.unchained,
            head_seq=head_seq,
            head_hash=head_hash,
            breaks=tuple(every[:BREAKS_KEPT]),
            check=check,
            from_seq=from_seq,
            to_seq=self.last_seq if head_seq is None else head_seq,
            pruned_through=pruned_through,
            more_breaks=more,
        )


StoredRow = tuple[Any, Any, Any, Any]  # a stored row's (seq, receipt_id, json, hash) columns


def verify_rows(
    rows: Iterable[Receipt | UnreadableReceipt | StoredRow], head: tuple[int, str] | None
) -> ChainReport:
    """The chain check over rows in stored ``seq`` order: receipts as a store returns them, or
    stored rows' ``(seq, receipt_id, json, hash)`` columns. Any iterable; nothing is kept per row."""
    walk = ChainWalk()
    add, add_stored = walk.add, walk.add_stored
    for row in rows:
        if type(row) is tuple:
            add_stored(*row)
        else:
            add(row)  # type: ignore[arg-type]
    return walk.report(head)


def walk_snapshot(snapshot: Any, since_verified: bool) -> ChainReport:
    """The check over one store snapshot (``store.snapshot.Snapshot``): from the verified mark
    when asked and there is one, else everything."""
    walk = ChainWalk()
    walk.add_unchained(snapshot.unchained)
    mark = snapshot.mark if since_verified else None
    checkpoint = snapshot.checkpoint  # (seq, hash) where a prune left the chain, or None
    pruned = None if checkpoint is None else checkpoint[0]
    if mark is not None and mark.seq >= 1 and (pruned is None or mark.seq > pruned):
        walk.start_at_mark((mark.seq, mark.hash), snapshot.row_at(mark.seq))
        start, check, first = mark.seq, "incremental", mark.seq
    elif checkpoint is not None:  # a full check of a pruned chain starts at its checkpoint
        walk.start_at_checkpoint(*checkpoint)
        start, check, first = checkpoint[0], "full", checkpoint[0] + 1
    else:  # no mark (or one before any receipt): the full check
        start, check, first = 0, "full", 1
    add = walk.add_stored
    for seq, receipt_id, text, stored in snapshot.rows_after(start):
        add(seq, receipt_id, text, stored)
    return walk.report(snapshot.head, check=check, from_seq=first, pruned_through=pruned)
