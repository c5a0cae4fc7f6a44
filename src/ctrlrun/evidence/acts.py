"""The operator acts chain: every grant, denial, resolution, hold, prune and delegation a
person (or their tool) made, hash-chained like receipts, and the cross-check of receipts
against it. Pure: the stores write and read the rows; this module builds, hashes and judges.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..action import canonical_bytes, sha256_hex
from .receipt import GENESIS_HASH

__all__ = [
    "ACT_SCHEMA",
    "Act",
    "ActKind",
    "ActsCoverage",
    "ActsWalk",
    "Finding",
    "act_document",
    "act_from_row",
    "act_hash",
    "grant_entry",
    "judge_resolved",
    "judge_spent",
    "spending_receipt",
]

ACT_SCHEMA = "ctrlrun.act/v1"
Finding = tuple[str, int | None, str]  # (break name, seq, detail)
_SPENDING = frozenset(("committed", "failed", "ambiguous"))  # results of an attempt that ran


class ActKind(StrEnum):
    """The closed set of recorded operator acts."""

    GRANT = "grant"
    GRANT_EDITED = "grant_edited"
    DENY = "deny"
    RESOLVE = "resolve"
    HOLD_PLACE = "hold_place"
    HOLD_RELEASE = "hold_release"
    PRUNE = "prune"
    DELEGATE = "delegate"
    REVOKE = "revoke"


@dataclass(frozen=True, slots=True)
class Act:
    """One stored act: its place in the acts chain and what it says."""

    seq: int
    kind: str
    subject: str
    by: str
    at: str
    receipt_seq: int  # the receipt chain's head when the act was written
    detail: Mapping[str, Any]
    prev_hash: str
    hash: str

    def document(self) -> dict[str, Any]:
        """What the act's hash covers."""
        return act_document(self.seq, self.prev_hash, self.kind, self.subject, self.by, self.at,
                            self.receipt_seq, self.detail)  # fmt: skip

    def rehash(self) -> str:
        return act_hash(self.document())

    def to_dict(self) -> dict[str, Any]:
        return {**self.document(), "hash": self.hash}


def act_document(
    seq: int, prev_hash: str, kind: str, subject: str, by: str, at: str, receipt_seq: int,
    detail: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The document an act's hash covers (its row's ``json`` column)."""
    return {
        "schema": ACT_SCHEMA, "seq": seq, "prev_hash": prev_hash, "kind": str(kind),
        "subject": subject, "by": by, "at": at, "receipt_seq": receipt_seq, "detail": dict(detail),
    }  # fmt: skip


def act_hash(document: Mapping[str, Any]) -> str:
    """``sha256:`` over the document's canonical bytes, as a receipt's hash is made."""
    return sha256_hex(canonical_bytes(document))


def act_from_row(seq: int, text: str, stored: str) -> Act | None:
    """A stored act's row as an ``Act``; ``None`` when its JSON is not an act document."""
    try:
        d = json.loads(text)
        return Act(int(d["seq"]), str(d["kind"]), str(d["subject"]), str(d["by"]), str(d["at"]),
                   int(d["receipt_seq"]), dict(d["detail"]), str(d["prev_hash"]), stored)  # fmt: skip
    except (ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True, slots=True)
class ActsCoverage:
    """Where the acts chain's evidence starts: receipts below ``covers_from`` predate it, and
    the ``legacy`` answers (grants and resolutions made before it, listed when the store was
    upgraded) are accounted for without an act."""

    covers_from: int = 1
    legacy_grants: frozenset[str] = frozenset()
    legacy_resolutions: frozenset[tuple[str, int]] = frozenset()


# ---------------------------------------------------------------- the acts chain's own walk


class ActsWalk:
    """Walk stored acts in ``seq`` order and name every place the acts chain does not verify;
    the break names are the receipt chain's, their detail starting ``acts chain``."""

    def __init__(self, start: tuple[int, str] | None = None) -> None:
        self.expected_seq, self.expected_prev = (1, GENESIS_HASH) if start is None else (start[0] + 1, start[1])
        self.verified = 0
        self.breaks: list[Finding] = []
        self.last: tuple[int, str] = (self.expected_seq - 1, self.expected_prev)

    def add(self, seq: int, text: str, stored: str) -> Act | None:
        """One stored row; the act when it verifies (the cross-check uses only those)."""
        if seq != self.expected_seq:
            self.breaks.append(("missing", self.expected_seq,
                                f"acts chain: act seq {self.expected_seq}..{seq - 1} is not in the store"))  # fmt: skip
        act = act_from_row(seq, text, stored)
        recomputed = None if act is None else act.rehash()
        ok = False
        if act is None or act.seq != seq:
            self.breaks.append(("content_altered", seq, f"acts chain: act {seq} is not a readable act document"))
        elif recomputed != stored:
            self.breaks.append(("content_altered", seq, f"acts chain: act {seq} hashes to {recomputed}, stored {stored}"))
        elif act.prev_hash != self.expected_prev:
            self.breaks.append(("link_broken", seq,
                                f"acts chain: act {seq} points back to {act.prev_hash}, expected {self.expected_prev}"))  # fmt: skip
        else:
            ok = True
            self.verified += 1
        self.expected_prev = recomputed or "<unverifiable>"
        self.expected_seq = seq + 1
        self.last = (seq, self.expected_prev)
        return act if ok else None

    def finish(self, head: tuple[int, str] | None) -> None:
        """Against the acts head read before the rows."""
        if head is None:
            self.breaks.append(("head_mismatch", None, "acts chain: the acts head row is missing"))
        elif head != self.last:
            self.breaks.append(("head_mismatch", head[0],
                                f"acts chain: the head records seq {head[0]} {head[1]}, the acts end at seq "
                                f"{self.last[0]} {self.last[1]}"))  # fmt: skip


# ---------------------------------------------------------------- receipts against acts

def grant_entry(act: Act) -> tuple[int, str, str]:
    """What a grant act says for the cross-check: ``(receipt_seq, bound action hash, approver)``."""
    return act.receipt_seq, str(act.detail.get("action_hash")), act.by


def judge_spent(
    seq: int, approval_id: str, approver: Any, action_hash: str, result: str,
    grants: Iterable[tuple[int, str, str]], coverage: ActsCoverage,
) -> Finding | None:  # fmt: skip
    """A receipt naming an approval: when its attempt ran it spent that approval, and a grant
    act written before it, by that approver, for that action must exist."""
    if result not in _SPENDING or not isinstance(approver, str):
        return None
    if seq < coverage.covers_from or approval_id in coverage.legacy_grants:
        return None
    for receipt_seq, bound, by in grants:
        if receipt_seq < seq and bound == action_hash and by == approver:
            return None
    return ("approval_unrecorded", seq,
            f"receipt {seq} spent approval {approval_id} (approver {approver!r}), and no grant "
            "act records that answer for this action")  # fmt: skip


def judge_resolved(
    effect_key: str, attempt: int, last_seq: int | None, resolved_attempts: Iterable[int],
    coverage: ActsCoverage,
) -> Finding | None:  # fmt: skip
    """An effect that reads as resolved: a resolve act for this attempt of its key must exist."""
    if attempt in resolved_attempts or (effect_key, attempt) in coverage.legacy_resolutions:
        return None
    return ("resolution_unrecorded", last_seq,
            f"effect {effect_key!r} (attempt {attempt}) reads as resolved, and no resolve act "
            "records who settled it")  # fmt: skip


def spending_receipt(seq: int, text: Any) -> tuple[int, str, Any, str, str] | None:
    """A stored receipt naming an approval as ``(seq, approval_id, approver, action_hash,
    result)``; ``None`` when unreadable (that is the receipt walk's finding)."""
    try:
        d = json.loads(text)
        return seq, str(d["approval_id"]), d.get("approver"), str(d.get("action_hash")), str(d.get("result"))
    except (ValueError, TypeError, KeyError):
        return None
