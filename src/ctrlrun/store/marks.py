"""The verified mark as a value, and where a store keeps it: what reading and checking a store's
evidence need to know of it (moving it is ``verifymark``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MARK_SELECT", "MEMORY_ATTRIBUTE", "VerifiedMark", "mark_of"]

MEMORY_ATTRIBUTE = "verified_mark"  # where an InMemoryStateStore keeps its mark
MARK_SELECT = "SELECT seq, hash, verified_at, acts_seq, acts_hash FROM verified_mark WHERE id = 1"  # SQLite


@dataclass(frozen=True, slots=True)
class VerifiedMark:
    """Where the last successful check ended: the head it verified, and when."""

    seq: int
    hash: str
    verified_at: str
    acts_seq: int | None = None  # the acts chain's head it verified too (None: not recorded)
    acts_hash: str | None = None


def mark_of(row: Any) -> VerifiedMark | None:
    """A ``(seq, hash, verified_at[, acts_seq, acts_hash])`` row as a mark (``None`` for no row)."""
    if row is None:
        return None
    acts = (int(row[3]), str(row[4])) if len(row) > 4 and row[3] is not None and row[4] is not None else (None, None)
    return VerifiedMark(int(row[0]), str(row[1]), str(row[2]), *acts)
