"""The receipt chain check: walk the receipts by stored ``seq`` and name every break."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .receipt import GENESIS_HASH, _NOT_STORED, Receipt, UnreadableReceipt

__all__ = ["ChainBreak", "ChainReport", "verify_chain", "verify_rows"]


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
    """What ``verify_chain`` found."""

    verified: int
    chained: int
    unchained: int
    head_seq: int | None
    head_hash: str | None
    breaks: tuple[ChainBreak, ...]

    @property
    def ok(self) -> bool:
        return not self.breaks

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "chained": self.chained,
            "unchained": self.unchained,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "breaks": [b.to_dict() for b in self.breaks],
        }


_SENTINEL = "<unverifiable>"


def _position(row: Receipt | UnreadableReceipt) -> int | None:
    """Where a row sits in the chain: its stored ``seq`` column when it came from a store."""
    if isinstance(row, Receipt) and row.stored_seq != _NOT_STORED:
        return row.stored_seq
    return row.seq


def verify_chain(store: Any) -> ChainReport:
    """Walk the store's receipts by stored ``seq`` and name every break in the chain."""
    rows = list(store.receipts())
    return verify_rows(rows, store.chain_head())


def verify_rows(
    rows: Iterable[Receipt | UnreadableReceipt], head: tuple[int, str] | None
) -> ChainReport:
    """The chain check over rows already read (ordered by their stored ``seq``)."""
    placed = [(_position(r), r) for r in rows]
    breaks: list[ChainBreak] = []
    unchained = [r for position, r in placed if position is None]
    chained = sorted(((p, r) for p, r in placed if p is not None), key=lambda pr: pr[0])
    if unchained:
        breaks.append(
            ChainBreak("unchained", None, f"{len(unchained)} receipt(s) have no chain position")
        )
    expected_seq, expected_prev = 1, GENESIS_HASH
    last_seq, last_hash = 0, GENESIS_HASH
    verified = 0
    for seq, row in chained:
        row_breaks: list[ChainBreak] = []
        if seq != expected_seq:
            gap = f"seq {expected_seq}" if seq == expected_seq + 1 else f"seq {expected_seq}..{seq - 1}"
            row_breaks.append(ChainBreak("missing", expected_seq, f"{gap} is not in the store"))
            expected_seq = seq
        if isinstance(row, UnreadableReceipt):
            row_breaks.append(
                ChainBreak("content_altered", seq, f"the stored receipt cannot be read: {row.error}")
            )
            breaks.extend(row_breaks)
            expected_prev = _SENTINEL
            last_seq, last_hash = seq, _SENTINEL
            expected_seq += 1
            continue
        try:
            recomputed = row.chain_hash()
        except Exception as exc:  # a document with no canonical form
            row_breaks.append(
                ChainBreak("content_altered", seq, f"the receipt has no canonical form: {exc}")
            )
            breaks.extend(row_breaks)
            expected_prev = _SENTINEL
            last_seq, last_hash = seq, _SENTINEL
            expected_seq += 1
            continue
        if not row.hash:
            row_breaks.append(ChainBreak("hash_missing", seq, "the stored hash is empty"))
        elif recomputed != row.hash:
            row_breaks.append(
                ChainBreak(
                    "content_altered",
                    seq,
                    f"receipt {row.receipt_id} hashes to {recomputed}, stored {row.hash}",
                )
            )
        if row.prev_hash != expected_prev:
            row_breaks.append(
                ChainBreak(
                    "link_broken",
                    seq,
                    f"receipt {row.receipt_id} points back to {row.prev_hash}, "
                    f"expected {expected_prev}",
                )
            )
        if not row_breaks:
            verified += 1
        breaks.extend(row_breaks)
        expected_prev = recomputed
        last_seq, last_hash = seq, recomputed
        expected_seq += 1
    if head is None:
        breaks.append(ChainBreak("head_mismatch", None, "the chain head row is missing"))
        head_seq, head_hash = None, None
    else:
        head_seq, head_hash = head
        if (head_seq, head_hash) != (last_seq, last_hash):
            breaks.append(
                ChainBreak(
                    "head_mismatch",
                    head_seq,
                    f"the head records seq {head_seq} {head_hash}, "
                    f"the receipts end at seq {last_seq} {last_hash}",
                )
            )
    return ChainReport(
        verified=verified,
        chained=len(chained),
        unchained=len(unchained),
        head_seq=head_seq,
        head_hash=head_hash,
        breaks=tuple(breaks),
    )
