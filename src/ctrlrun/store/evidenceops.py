"""The store operations of the evidence: the acts chain (written with each operator act),
holds, and prune in bounded batches behind a checkpoint. Written once over the ``Tx`` rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .._time import format_precise, format_ts
from ..action import Action, Principal, canonical_bytes, new_id
from ..evidence.acts import Act, ActKind, act_document, act_from_row, act_hash
from ..effects.records import check_line_text
from ..errors import InvalidArgument
from ..evidence.receipt import Receipt
from ..evidence.retention import (
    PrunePlan,
    PruneResult,
    CHECKPOINT_SCHEMA,
    PRUNE_ACTION,
    PRUNE_BATCH,
    Checkpoint,
    Hold,
    PruneRefused,
    check_hold_range,
    check_prune_range,
)
from .steps import _check_id, _place_receipt

__all__ = ["EvidenceOps", "PrunePlan", "PruneResult", "record_act"]

T = TypeVar("T")
_PAGE = 500


def record_act(tx: Any, now: datetime, kind: ActKind, subject: str, by: str, detail: Mapping[str, Any]) -> Act:
    """Append one act to the acts chain inside the caller's transaction (the act's own)."""
    moved = tx.advance_acts()
    if moved is None:
        raise InvalidArgument(
            "the acts chain head row is missing, so no operator act can be recorded; the store "
            "was altered (run `ctrlrun receipts --verify-chain`)"
        )
    seq, prev = moved
    head = tx.head()
    receipt_seq = 0 if head is None else head[0]
    at = format_precise(now)
    document = act_document(seq, prev, kind, subject, by, at, receipt_seq, detail)
    digest = act_hash(document)
    tx.insert_act(seq, str(kind), subject, canonical_bytes(document).decode("utf-8"), digest)
    return Act(seq, str(kind), subject, by, at, receipt_seq, dict(detail), prev, digest)


class EvidenceOps:
    """Acts, holds and prune, over the backend's ``_read`` / ``_write``."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]

    # -- what anchors and verification read

    def receipt_hash_at(self, seq: int) -> str | None:
        """The stored hash of the receipt at ``seq``; ``None`` when there is none."""
        row = self._read(lambda tx, now: tx.receipt_at(seq))
        return None if row is None else str(row[3])

    def prune_checkpoint(self) -> Checkpoint | None:
        """Where the last prune left the chain; ``None`` when it was never pruned."""
        found: Checkpoint | None = self._read(lambda tx, now: tx.checkpoint())
        return found

    def acts_head(self) -> tuple[int, str] | None:
        """The acts chain's head ``(seq, hash)`` (``(0, genesis)`` before the first act)."""
        head = self._read(lambda tx, now: tx.acts_head())
        return None if head is None else (head[0], head[1])

    def acts_coverage_from(self) -> int | None:
        """The first receipt seq the acts cross-check covers (1 for a store made with it)."""
        head = self._read(lambda tx, now: tx.acts_head())
        return None if head is None else int(head[2])

    def act_hash_at(self, seq: int) -> str | None:
        row = self._read(lambda tx, now: tx.act_at(seq))
        return None if row is None else str(row[1])

    def iter_acts(self, after: int = 0, *, page: int = _PAGE) -> Iterator[Act]:
        """Every readable act after ``after``, in chain order, a page per read."""
        while True:
            rows = self._read(lambda tx, now: tx.acts_page(after, page))
            for seq, text, stored in rows:
                act = act_from_row(seq, text, stored)
                if act is not None:
                    yield act
            if len(rows) < page:
                return
            after = rows[-1][0]

    def acts_about(self, subject: str) -> tuple[Act, ...]:
        rows = self._read(lambda tx, now: tx.acts_about([subject]))
        return tuple(a for a in (act_from_row(*r) for r in rows) if a is not None)

    def note_anchor(self, kind: str, seq: int, hash: str, token: str, at: str) -> None:
        """Keep a local note of an anchor made (the provider's history is the evidence)."""
        self._write(lambda tx, now: tx.note_anchor(kind, seq, hash, token, at))

    # -- holds

    def holds(self) -> tuple[Hold, ...]:
        return tuple(self._read(lambda tx, now: tx.holds()))

    def place_hold(self, hold_id: str, from_seq: int, to_seq: int | None, *, reason: str, by: str) -> Hold:
        """Keep receipts ``from_seq..to_seq`` (open-ended without ``to_seq``) from every prune."""
        _check_id(hold_id, "hold id")
        check_line_text(reason, "reason")
        check_line_text(by, "by")
        check_hold_range(from_seq, to_seq)

        def place(tx: Any, now: datetime) -> Hold:
            hold = Hold(hold_id, from_seq, to_seq, reason, by, format_precise(now))
            if not tx.insert_hold(hold):
                raise InvalidArgument(f"hold {hold_id!r} already exists; a hold id is used once")
            record_act(tx, now, ActKind.HOLD_PLACE, hold_id, by,
                       {"from_seq": from_seq, "to_seq": to_seq, "reason": reason})  # fmt: skip
            return hold

        placed: Hold = self._write(place)
        return placed

    def release_hold(self, hold_id: str, *, by: str) -> Hold:
        _check_id(hold_id, "hold id")
        check_line_text(by, "by")

        def release(tx: Any, now: datetime) -> Hold:
            at = format_precise(now)
            if not tx.release_hold(hold_id, by, at):
                known = [h for h in tx.holds() if h.hold_id == hold_id]
                if not known:
                    raise InvalidArgument(f"no hold {hold_id!r}; `ctrlrun hold list` shows them")
                raise InvalidArgument(f"hold {hold_id!r} was already released by {known[0].released_by}")
            record_act(tx, now, ActKind.HOLD_RELEASE, hold_id, by, {})
            hold: Hold = next(h for h in tx.holds() if h.hold_id == hold_id)
            return hold

        released: Hold = self._write(release)
        return released

    # -- prune

    def plan_prune(self, through: int, *, older_than: timedelta) -> PrunePlan:
        """Every refusal of a prune through ``through``, decided against the store as it stands;
        the plan when none applies. Reads only."""
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidArgument(f"older_than must be a timedelta >= 0, got {older_than!r}")
        plan: PrunePlan = self._read(lambda tx, now: _plan(tx, now, through, older_than))
        return plan

    def prune(
        self, through: int, *, older_than: timedelta, by: str, reason: str,
        batch: int = PRUNE_BATCH, anchor: Callable[[int, str], Any] | None = None,
        after_batch: Callable[[int], None] | None = None,
    ) -> PruneResult:  # fmt: skip
        """Delete receipts up to ``through`` in batches of ``batch``, each its own transaction,
        behind a checkpoint that moves with each; ``anchor(seq, hash)`` is called once, before
        anything is written. The first batch also writes the prune's receipt and its act."""
        check_line_text(by, "by")
        check_line_text(reason, "reason")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgument(f"batch must be an int >= 1, got {batch!r}")
        plan = self.plan_prune(through, older_than=older_than)
        if anchor is not None:
            anchor(plan.through, plan.hash)
        receipt_id = new_id("ctr")

        def first_batch(tx: Any, now: datetime) -> tuple[int, Checkpoint]:
            again = _plan(tx, now, through, older_than, scan=False)  # nothing moved under the plan (a new hold)
            deleted, checkpoint = _delete_batch(tx, now, again.through, batch)
            record_act(tx, now, ActKind.PRUNE, receipt_id, by,
                       {"from_seq": again.first, "through": again.through, "reason": reason})  # fmt: skip
            receipt = _prune_receipt(receipt_id, by, reason, again.first, again.through, now)
            ids, head = tx.insert_events_and_advance_head([])
            _place_receipt(tx, receipt, head)
            return deleted, checkpoint

        deleted, checkpoint = self._write(first_batch)
        batches = 1
        if after_batch is not None:
            after_batch(checkpoint.seq)
        while checkpoint.seq < plan.through:
            step: tuple[int, Checkpoint] = self._write(
                lambda tx, now: _delete_batch(tx, now, plan.through, batch)
            )
            deleted += step[0]
            checkpoint = step[1]
            batches += 1
            if after_batch is not None:
                after_batch(checkpoint.seq)
        return PruneResult(plan.first, plan.through, deleted, batches, checkpoint, receipt_id)


def _plan(tx: Any, now: datetime, through: Any, older_than: timedelta, *, scan: bool = True) -> PrunePlan:
    """The range a prune deletes, or its refusal. ``scan=False`` (inside the first batch's write
    transaction) re-checks only the head, checkpoint, holds and junction, never the range's rows,
    so that transaction stays one batch long."""
    head = tx.head()
    if head is None:
        raise PruneRefused("the receipt chain head row is missing; nothing can be pruned", reason="head")
    checkpoint = tx.checkpoint()
    first = check_prune_range(through, head[0], checkpoint, [h for h in tx.holds() if h.live])
    last = tx.receipt_at(through)
    if last is None:
        raise PruneRefused(f"refusing to prune through seq {through}: no receipt has that seq "
                           "(run `ctrlrun receipts --verify-chain`)", seq=through, reason="missing")  # fmt: skip
    after = tx.receipt_at(through + 1)
    if after is None or after[2] != last[3]:
        found = "is missing" if after is None else f"points back to {after[2]}"
        raise PruneRefused(
            f"refusing to prune through seq {through}: the receipt at seq {through + 1} {found}, "
            f"not to seq {through}'s stored hash {last[3]}, so the pruned chain would not verify "
            "from its checkpoint; prune through another seq",
            seq=through + 1, reason="break",
        )  # fmt: skip
    if scan:
        _scan(tx, now, first, through, older_than)
    return PrunePlan(first, through, str(last[3]), head[0])


def _scan(tx: Any, now: datetime, first: int, through: int, older_than: timedelta) -> None:
    """Refuse when a receipt in the range is of an unsettled effect, a pending approval or a
    budget charge newer than ``older_than``."""
    found = tx.prune_blocker("unsettled", first, through)
    if found is not None:
        seq, key, state = found
        raise PruneRefused(
            f"refusing to prune seq {first}..{through}: the receipt at seq {seq} is of effect {key!r}, which "
            f"is still {state}; settle it first (`ctrlrun effects --state {state}`, `ctrlrun resolve`)",
            seq=seq, reason="unsettled",
        )  # fmt: skip
    found = tx.prune_blocker("pending", first, through, now=format_precise(now))
    if found is not None:
        seq, approval_id = found
        raise PruneRefused(
            f"refusing to prune seq {first}..{through}: the receipt at seq {seq} names approval "
            f"{approval_id}, which is still pending; answer it or let it expire first",
            seq=seq, reason="pending",
        )  # fmt: skip
    found = tx.prune_blocker("recent_charge", first, through, since=format_precise(now - older_than))
    if found is not None:
        seq, key, at = found
        raise PruneRefused(
            f"refusing to prune seq {first}..{through}: the receipt at seq {seq} is of effect {key!r}, whose "
            f"budget charge at {at} is newer than --older-than; prune through seq {seq - 1}, or "
            "wait until the charge is older",
            seq=seq, reason="ledger",
        )  # fmt: skip


def _delete_batch(tx: Any, now: datetime, through: int, batch: int) -> tuple[int, Checkpoint]:
    moved = tx.delete_batch(through, batch)
    if moved is None:  # nothing left below ``through``: the checkpoint is already there
        before: Checkpoint | None = tx.checkpoint()
        assert before is not None
        return 0, before
    count, seq, hash = moved
    checkpoint = Checkpoint(seq, hash, CHECKPOINT_SCHEMA, format_precise(now))
    tx.set_checkpoint(checkpoint)
    return count, checkpoint


def _prune_receipt(receipt_id: str, by: str, reason: str, first: int, through: int, now: datetime) -> Receipt:
    action = Action(
        PRUNE_ACTION, {"by": by, "reason": reason, "from_seq": first, "through": through},
        Principal(by), resource=None, environment="operator",
    )  # fmt: skip
    at = format_ts(now)
    return Receipt(
        receipt_id=receipt_id, action_id=action.action_id, action=action.name,
        action_hash=action.action_hash, principal=action.principal, resource=None,
        arguments=action.canonical_arguments, environment=action.environment, decision="allow",
        decision_reason=f"retention prune by {by}", approval_id=None, approver=None,
        effect_key=None, attempt=1, result="committed", execution=None, would_have=None,
        error=None, started_at=at, finished_at=at,
    )  # fmt: skip
