"""The acts half of ``receipts --verify-chain``: walk the acts chain up to its head, then judge
the receipts that spent an approval and the effects that read as resolved against the acts
recorded for them, a page at a time (the acts of a page's requests or keys looked up by index).

It runs after the receipt walk, so every receipt it judges was written before it reads the
acts: an act a receipt depends on (the grant before the spend) is already committed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..evidence.acts import (
    ActKind,
    ActsCoverage,
    ActsWalk,
    Finding,
    act_from_row,
    grant_entry,
    judge_resolved,
    judge_spent,
    spending_receipt,
)
from ..evidence.chain import BREAKS_KEPT, ChainBreak, ChainReport
from .marks import VerifiedMark

__all__ = ["check_acts"]

_PAGE = 500
_GRANTS = (ActKind.GRANT, ActKind.GRANT_EDITED)


def check_acts(store: Any, report: ChainReport, mark: VerifiedMark | None) -> ChainReport:
    """``report`` with the acts chain's findings added (and its head, for the verified mark);
    ``mark``: an incremental check, which costs the acts and receipts written after it."""
    read = store._read
    head = read(lambda tx, now: tx.acts_head())
    found: list[Finding] = []
    if head is None:
        walk = ActsWalk()
        walk.finish(None)
        return _merged(report, walk.breaks, 0, None, None)
    head_seq, head_hash, covers_from = head
    legacy = read(lambda tx, now: tx.acts_legacy())
    coverage = ActsCoverage(
        covers_from,
        frozenset(s for k, s, _ in legacy if k == "grant"),
        frozenset((s, a) for k, s, a in legacy if k == "resolve"),
    )  # fmt: skip
    incremental = mark is not None and mark.acts_seq is not None and mark.acts_hash is not None
    walk = _walk_acts(read, head_seq, mark if incremental else None)
    walk.finish((head_seq, head_hash))
    found.extend(walk.breaks)
    since = mark.seq if mark is not None else None
    found.extend(_spent(read, report, coverage, since))
    found.extend(_resolved(read, coverage, since))
    not_covered = covers_from - 1 if covers_from > 1 else None
    return _merged(report, found, walk.verified, (head_seq, head_hash), not_covered)


def _walk_acts(read: Any, head_seq: int, mark: VerifiedMark | None) -> ActsWalk:
    if mark is None or mark.acts_seq is None or mark.acts_hash is None or mark.acts_seq < 1:
        walk, after = ActsWalk(), 0
    else:
        walk, after = ActsWalk((mark.acts_seq, mark.acts_hash)), mark.acts_seq
        at = read(lambda tx, now: tx.act_at(after))
        act = None if at is None else act_from_row(after, at[0], at[1])
        if act is None or act.rehash() != mark.acts_hash or at[1] != mark.acts_hash:
            walk.breaks.append(("content_altered", after,
                                f"acts chain: the act at the verified mark (seq {after}) no longer "
                                f"hashes to the mark's {mark.acts_hash}"))  # fmt: skip
        else:
            walk.verified += 1  # re-hashed, as the receipt at the mark is
    while after < head_seq:
        rows = read(lambda tx, now: tx.acts_page(after, _PAGE))
        rows = [r for r in rows if r[0] <= head_seq]
        for seq, text, stored in rows:
            walk.add(seq, text, stored)
        if len(rows) < _PAGE:
            break
        after = rows[-1][0]
    return walk


def _spent(read: Any, report: ChainReport, coverage: ActsCoverage, since: int | None) -> list[Finding]:
    """Every receipt (after the mark) that spent an approval, against its request's grant acts."""
    found: list[Finding] = []
    after = since or 0
    while True:
        rows = read(lambda tx, now: tx.approval_receipts(after, report.to_seq, _PAGE))
        spends = [s for s in (spending_receipt(seq, text) for seq, text in rows) if s is not None]
        grants = _acts_for(read, sorted({s[1] for s in spends}), _GRANTS)
        for seq, approval_id, approver, action_hash, result in spends:
            entries = [grant_entry(a) for a in grants.get(approval_id, ())]
            finding = judge_spent(seq, approval_id, approver, action_hash, result, entries, coverage)
            if finding is not None:
                found.append(finding)
        if len(rows) < _PAGE:
            return found
        after = rows[-1][0]


def _resolved(read: Any, coverage: ActsCoverage, since: int | None) -> list[Finding]:
    """Every effect that reads as resolved (named by a receipt after the mark, when there is
    one) against its key's resolve acts."""
    found: list[Finding] = []
    after = ""
    while True:
        rows = read(lambda tx, now: tx.resolved_effects(after, _PAGE, since))
        settled = [r for r in rows if r[2] is not None or r[5] == "ambiguous"]
        acts = _acts_for(read, sorted({r[0] for r in settled}), (ActKind.RESOLVE,))
        for key, attempt, _by, _state, last_seq, _result in settled:
            attempts = {int(a.detail.get("attempt", 0)) for a in acts.get(key, ())}
            finding = judge_resolved(key, int(attempt), last_seq, attempts, coverage)
            if finding is not None:
                found.append(finding)
        if len(rows) < _PAGE:
            return found
        after = rows[-1][0]


def _acts_for(read: Any, subjects: list[str], kinds: tuple[ActKind, ...]) -> dict[str, list[Any]]:
    """The verified-readable acts of these kinds about each subject."""
    out: dict[str, list[Any]] = {}
    for i in range(0, len(subjects), 100):
        chunk = subjects[i : i + 100]
        for seq, text, stored in read(lambda tx, now: tx.acts_about(chunk)):
            act = act_from_row(seq, text, stored)
            if act is not None and act.kind in kinds:
                out.setdefault(act.subject, []).append(act)
    return out


def _merged(
    report: ChainReport, found: list[Finding], verified: int, head: tuple[int, str] | None,
    not_covered: int | None,
) -> ChainReport:  # fmt: skip
    extra = [ChainBreak(name, seq, detail) for name, seq, detail in found]
    every = [*report.breaks, *extra]
    more = report.more_breaks + max(0, len(every) - BREAKS_KEPT)
    return replace(
        report, breaks=tuple(every[:BREAKS_KEPT]), more_breaks=more, acts_verified=verified,
        acts_head_seq=None if head is None else head[0],
        acts_head_hash=None if head is None else head[1], not_covered=not_covered,
    )  # fmt: skip
