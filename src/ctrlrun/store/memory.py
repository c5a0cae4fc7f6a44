"""``InMemoryStateStore``: the store rules over dicts, for tests and single-process experiments."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from ..authority.ledger import Consumption, DelegationRecord
from .._time import format_precise, require_aware, utc_now
from ..approvals.records import ApprovalRecord, ApprovalStatus
from ..effects.records import (
    EffectRecord,
    EffectState,
)
from ..evidence.drafts import EventRow, ReceiptDraft, event_from_row
from ..errors import InvalidArgument
from ..evidence.receipt import GENESIS_HASH, Event, Receipt, UnreadableReceipt
from . import codec
from .evidencemem import EvidenceData, MemoryEvidenceRows
from .ledger import consumption_from_row, delegation_from_row, delegation_to_row
from .ops import EventsFn, StoreOps
from .rows import KeptWrite, Tx, TxSteps
from .straight import Finished, Started, StraightWrites, fresh_start

__all__ = ["InMemoryStateStore"]

T = TypeVar("T")
Row = dict[str, Any]
_ZERO = timedelta(0)


@dataclass
class _Data:
    effects: dict[str, Row] = field(default_factory=dict)
    approvals: dict[str, Row] = field(default_factory=dict)
    events: list[EventRow] = field(default_factory=list)  # event ``id`` n at index n - 1
    receipts: dict[str, Row] = field(default_factory=dict)
    head: tuple[int, str] | None = (0, GENESIS_HASH)
    delegations: dict[str, Row] = field(default_factory=dict)
    ledger: list[Row] = field(default_factory=list)  # row ``id`` n at index n - 1
    # the ledger's indexes: row ids by (grant, metric) and by effect key, and its unique key
    ledger_by_budget: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    ledger_by_key: dict[str, list[int]] = field(default_factory=dict)
    ledger_taken: set[tuple[str, int, str, str]] = field(default_factory=set)
    evidence: EvidenceData = field(default_factory=EvidenceData)


class _MemoryTx(MemoryEvidenceRows, TxSteps):
    """Row operations over the store's dicts; writes stay in an overlay until ``commit``."""

    def __init__(self, data: _Data) -> None:
        self._data = data
        self._effects: dict[str, Row] = {}
        self._approvals: dict[str, Row] = {}
        self._events: list[EventRow] = []  # ids following the store's
        self._receipts: dict[str, Row] = {}
        self._head = data.head
        self._delegations: dict[str, Row] = {}
        self._ledger: dict[int, Row] = {}  # rows added or released, by id
        self._next_ledger = len(data.ledger) + 1

    def commit(self) -> None:
        data = self._data
        data.effects.update(self._effects)
        data.approvals.update(self._approvals)
        data.events.extend(self._events)
        data.receipts.update(self._receipts)
        data.head = self._head
        data.delegations.update(self._delegations)
        for row_id in sorted(self._ledger):
            row = self._ledger[row_id]
            if row_id <= len(data.ledger):
                data.ledger[row_id - 1] = row
                continue
            data.ledger.append(row)
            data.ledger_by_budget.setdefault((row["grant_id"], row["metric"]), []).append(row_id)
            data.ledger_by_key.setdefault(row["effect_key"], []).append(row_id)
            data.ledger_taken.add((row["effect_key"], row["attempt"], row["grant_id"], row["metric"]))
        self.commit_evidence()

    # effects
    def _effect_row(self, effect_key: str) -> Row | None:
        return self._effects.get(effect_key, self._data.effects.get(effect_key))

    def effect(self, effect_key: str) -> EffectRecord | None:
        row = self._effect_row(effect_key)
        return None if row is None else codec.effect_from_row(row)

    def insert_effect(self, record: EffectRecord) -> bool:
        if self._effect_row(record.effect_key) is not None:
            return False
        self._effects[record.effect_key] = codec.effect_to_row(record)
        return True

    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        row = self._effect_row(expected.effect_key)
        seen = (expected.state.value, expected.action_id, expected.attempt)
        if row is None or (row["state"], row["action_id"], row["attempt"]) != seen:
            return False
        self._effects[expected.effect_key] = codec.effect_to_row(record)
        return True

    def finish_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        row = self._effect_row(expected.effect_key)
        if row is None:
            return False
        seen = (row["action_id"], row["state"], row["result_json"], row["error"])
        if seen != (expected.action_id, expected.state.value, None, None):
            return False
        finished = dict(zip(codec.FINISHED_FIELDS, codec.finished_values(record)))
        self._effects[expected.effect_key] = {**row, **finished}
        return True

    # approvals
    def _approval_row(self, approval_id: str) -> Row | None:
        return self._approvals.get(approval_id, self._data.approvals.get(approval_id))

    def approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._approval_row(approval_id)
        return None if row is None else codec.approval_from_row(row)

    def insert_approval(self, record: ApprovalRecord) -> bool:
        if self._approval_row(record.approval_id) is not None:
            return False
        self._approvals[record.approval_id] = codec.approval_to_row(record)
        return True

    def update_approval(self, expected: ApprovalRecord, record: ApprovalRecord) -> bool:
        row = self._approval_row(expected.approval_id)
        seen = (expected.status.value, codec.approvers_text(expected.approvers))
        if row is None or (row["status"], row["approvers"]) != seen:
            return False
        self._approvals[expected.approval_id] = codec.approval_to_row(record)
        return True

    def find_approvals(
        self,
        *,
        action_hash: str | None = None,
        status: ApprovalStatus | None = None,
        valid_at: datetime | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ApprovalRecord]:
        after = codec.ts(valid_at)
        rows = [
            r
            for r in {**self._data.approvals, **self._approvals}.values()
            if (action_hash is None or action_hash in (r["action_hash"], r.get("edited_action_hash")))
            and (status is None or r["status"] == status.value)
            and (after is None or r["expires_at"] >= after)
        ]
        rows.sort(key=lambda r: (r["created_at"], r["approval_id"]), reverse=newest_first)
        if limit is not None:
            rows = rows[:limit]
        return [codec.approval_from_row(r) for r in rows]

    # events
    def insert_events(self, rows: Sequence[EventRow]) -> Sequence[int]:
        first = len(self._data.events) + len(self._events) + 1
        self._events.extend(rows)
        return range(first, first + len(rows))

    def list_events(self) -> list[Event]:
        return list(map(event_from_row, [*self._data.events, *self._events], itertools.count(1)))

    # receipts
    def _has_receipt(self, receipt_id: str) -> bool:
        return receipt_id in self._receipts or receipt_id in self._data.receipts

    def insert_events_and_advance_head(
        self, rows: Sequence[EventRow]
    ) -> tuple[Sequence[int], tuple[int, str] | None]:
        ids = self.insert_events(rows)
        if self._head is None:
            return ids, None
        seq, previous = self._head
        self._head = (seq + 1, previous)
        return ids, self._head

    def place_receipt(self, row: tuple[Any, ...], *, last: bool = False) -> bool:
        if self._has_receipt(row[0]):
            return False
        assert self._head is not None and row[8] is not None
        self._receipts[row[0]] = dict(zip(codec.RECEIPT_ROW, row))
        self._head = (self._head[0], row[8])
        return True

    def list_receipts(self) -> list[Receipt | UnreadableReceipt]:
        rows = list({**self._data.receipts, **self._receipts}.values())
        rows.sort(key=lambda r: (r["seq"] is not None, r["seq"] or 0, r["receipt_id"]))
        return [codec.receipt_from_row(r) for r in rows]

    def stored_receipt(self, receipt_id: str) -> tuple[str, str] | None:
        row = self._receipts.get(receipt_id) or self._data.receipts.get(receipt_id)
        return None if row is None else (row["json"], row["hash"])

    def head(self) -> tuple[int, str] | None:
        return self._head

    # paged and indexed reads: the same answers as the SQL stores' indexes give
    def _receipt_rows(self) -> list[Row]:
        return list({**self._data.receipts, **self._receipts}.values())

    def receipts_page(
        self, after: int | str, limit: int, *, chained: bool = True
    ) -> list[Receipt | UnreadableReceipt]:
        if chained:
            rows = sorted((r for r in self._receipt_rows() if r["seq"] is not None and r["seq"] > after),
                          key=lambda r: r["seq"])  # fmt: skip
        else:
            rows = sorted((r for r in self._receipt_rows() if r["seq"] is None and r["receipt_id"] > after),
                          key=lambda r: r["receipt_id"])  # fmt: skip
        return [codec.receipt_from_row(r) for r in rows[:limit]]

    def receipts_tail(self, limit: int, *, chained: bool = True) -> list[Receipt | UnreadableReceipt]:
        rows = [r for r in self._receipt_rows() if (r["seq"] is not None) == chained]
        rows.sort(key=lambda r: r["seq"] if chained else r["receipt_id"], reverse=True)
        return [codec.receipt_from_row(r) for r in rows[:limit]]

    def receipt_at_or_after(self, seq: int) -> tuple[int, str | None] | None:
        rows = [r for r in self._receipt_rows() if r["seq"] is not None and r["seq"] >= seq]
        first = min(rows, key=lambda r: r["seq"], default=None)
        return None if first is None else (first["seq"], first["ts"])

    def receipts_by(self, column: str, value: str) -> list[Receipt | UnreadableReceipt]:
        rows = [r for r in self._receipt_rows() if r[column] == value]
        rows.sort(key=lambda r: (r["seq"] is not None, r["seq"] or 0, r["receipt_id"]))
        return [codec.receipt_from_row(r) for r in rows]

    def events_by(self, column: str, value: str) -> list[Event]:
        index = ("action_id", "effect_key", "approval_id").index(column) + 2  # (ts, type, …)
        rows = enumerate([*self._data.events, *self._events], 1)
        return [event_from_row(row, event_id) for event_id, row in rows if row[index] == value]

    def effects_page(
        self, state: EffectState | None, low: str | None, high: str | None,
        after: tuple[str, str] | None, limit: int,
    ) -> list[EffectRecord]:  # fmt: skip
        rows = [
            r for r in {**self._data.effects, **self._effects}.values()
            if (state is None or r["state"] == state.value)
            and (low is None or r["effect_key"] >= low) and (high is None or r["effect_key"] < high)
            and (after is None or (r["created_at"], r["effect_key"]) > after)
        ]  # fmt: skip
        rows.sort(key=lambda r: (r["created_at"], r["effect_key"]))
        return [codec.effect_from_row(r) for r in rows[:limit]]

    # the budget ledger (the store's lock serializes every writer already)
    def lock_budgets(self, budgets: Sequence[tuple[str, str]]) -> None:
        pass

    def _ledger_rows(self) -> list[Row]:
        rows = [self._ledger.get(i + 1, row) for i, row in enumerate(self._data.ledger)]
        rows += [self._ledger[i] for i in sorted(self._ledger) if i > len(self._data.ledger)]
        return rows

    def _ledger_ids(self, index: dict[Any, list[int]], key: Any, match: Any) -> list[int]:
        """Row ids under ``key`` in a committed index, then this transaction's new rows that match."""
        known = len(self._data.ledger)
        added = [i for i in sorted(self._ledger) if i > known and match(self._ledger[i])]
        return [*index.get(key, ()), *added]

    def _ledger_row(self, row_id: int) -> Row:
        return self._ledger.get(row_id) or self._data.ledger[row_id - 1]

    def spent(self, windows: Sequence[tuple[str, str, datetime]]) -> list[int]:
        sums = []
        for grant_id, metric, since in windows:
            after = codec.ts(since)
            ids = self._ledger_ids(
                self._data.ledger_by_budget, (grant_id, metric),
                lambda r: r["grant_id"] == grant_id and r["metric"] == metric,  # noqa: B023
            )  # fmt: skip
            rows = (self._ledger_row(i) for i in ids)
            sums.append(sum(r["amount"] for r in rows if r["released_at"] is None and r["consumed_at"] >= after))
        return sums

    def insert_consumptions(
        self, rows: Sequence[tuple[str, str, int]], effect_key: str, attempt: int, at: datetime
    ) -> None:
        known = len(self._data.ledger)
        taken = self._data.ledger_taken | {
            (r["effect_key"], r["attempt"], r["grant_id"], r["metric"])
            for i, r in self._ledger.items() if i > known
        }  # fmt: skip
        for grant_id, metric, amount in rows:
            if (effect_key, attempt, grant_id, metric) in taken:  # the table's unique key
                raise InvalidArgument(
                    f"the ledger already holds {grant_id}/{metric} for attempt {attempt} of "
                    f"{effect_key}; a charge is taken once per attempt"
                )
            row_id, self._next_ledger = self._next_ledger, self._next_ledger + 1
            taken.add((effect_key, attempt, grant_id, metric))
            self._ledger[row_id] = {
                "id": row_id, "grant_id": grant_id, "metric": metric, "amount": amount,
                "effect_key": effect_key, "attempt": attempt, "consumed_at": codec.ts(at),
                "released_at": None,
            }  # fmt: skip

    def release_consumptions(self, effect_key: str, at: datetime) -> None:
        ids = self._ledger_ids(self._data.ledger_by_key, effect_key, lambda r: r["effect_key"] == effect_key)
        for row_id in ids:
            row = self._ledger_row(row_id)
            if row["released_at"] is None:
                self._ledger[row_id] = {**row, "released_at": codec.ts(at)}

    def consumptions(
        self, *, grant_id: str | None, metric: str | None, since: datetime | None,
        effect_key: str | None,
    ) -> list[Consumption]:  # fmt: skip
        after = codec.ts(since)
        return [
            consumption_from_row(r) for r in self._ledger_rows()
            if (grant_id is None or r["grant_id"] == grant_id)
            and (metric is None or r["metric"] == metric)
            and (after is None or r["consumed_at"] >= after)
            and (effect_key is None or r["effect_key"] == effect_key)
        ]  # fmt: skip

    # delegations
    def _delegation_row(self, delegation_id: str) -> Row | None:
        return self._delegations.get(delegation_id, self._data.delegations.get(delegation_id))

    def delegation(self, delegation_id: str) -> DelegationRecord | None:
        row = self._delegation_row(delegation_id)
        return None if row is None else delegation_from_row(row)

    def insert_delegation(self, record: DelegationRecord) -> bool:
        if self._delegation_row(record.delegation_id) is not None:
            return False
        self._delegations[record.delegation_id] = delegation_to_row(record)
        return True

    def list_delegations(
        self, *, include_revoked: bool, parent_id: str | None
    ) -> list[DelegationRecord]:
        rows = [
            r for r in {**self._data.delegations, **self._delegations}.values()
            if (include_revoked or r["revoked_at"] is None)
            and (parent_id is None or r["parent_id"] == parent_id)
        ]  # fmt: skip
        rows.sort(key=lambda r: (r["created_at"], r["delegation_id"]))
        return [delegation_from_row(r) for r in rows]

    def revoke_delegation(self, delegation_id: str, by: str, at: datetime) -> bool:
        row = self._delegation_row(delegation_id)
        if row is None or row["revoked_at"] is not None:
            return False
        self._delegations[delegation_id] = {**row, "revoked_at": codec.ts(at), "revoked_by": by}
        return True


class InMemoryStateStore(StraightWrites, StoreOps):
    """All store rules over in-process dicts, one ``threading.Lock`` around each check-and-write.

    It shares state only between threads of one process and keeps nothing: no cross-process
    guarantee and no durability (everything is lost when the process ends).
    """

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(clock=clock)
        self._lock = threading.Lock()
        self._data = _Data()

    def _write(self, operation: Callable[[Tx, datetime], T]) -> T:
        with self._lock:
            self._count()
            tx = _MemoryTx(self._data)
            try:
                result = operation(tx, self._now())
            except KeptWrite as kept:
                tx.commit()
                raise kept.error from None
            tx.commit()
            return result

    def _read(self, operation: Callable[[Tx, datetime], T]) -> T:
        with self._lock:
            return operation(_MemoryTx(self._data), self._now())

    # The straight path's two primitives (``store.straight``), on the dicts under the lock: a new
    # key reserved into ``executing``, and that attempt committed with its receipt. A taken key, or
    # a record not as the start left it, is declined: the general path decides it.

    def _start_straight(self, action_id: str, effect_key: str, lease: timedelta, action_hash: str | None,
                        events: EventsFn, return_events: bool) -> Started | None:  # fmt: skip
        data = self._data
        with self._lock:
            if effect_key in data.effects:
                return None
            self.transactions += 1  # a write begins (under the store's lock)
            now = self.clock()
            if type(now) is not datetime or now.tzinfo is not timezone.utc:
                now = require_aware(now, "the store clock's time")
            reservation, values, rows = fresh_start(now, effect_key, action_id, lease, action_hash, events)
            # nothing below can fail: the write is whole or absent
            data.effects[effect_key] = dict(zip(codec.EFFECT_FIELDS, values))
            if not return_events:
                data.events.extend(rows)  # an event's id is its position: nothing to read back
                return None, reservation, ()
            return None, reservation, tuple(map(event_from_row, rows, self._append(rows)))

    def _finish_straight(self, effect_key: str, action_id: str, result: Any, rows: list[EventRow],
                         result_columns: tuple[Any, Any], draft: ReceiptDraft,
                         return_events: bool) -> Finished | None:  # fmt: skip
        data = self._data
        result_json, exact = result_columns
        with self._lock:
            row = data.effects.get(effect_key)
            if (
                row is None or row["action_id"] != action_id or row["state"] != "executing"
                or row["result_json"] is not None or row["error"] is not None or data.head is None
                or draft.receipt_id in data.receipts
            ):  # fmt: skip
                return None
            self.transactions += 1  # a write begins (under the store's lock)
            now = self.clock()
            if type(now) is not datetime or now.tzinfo is not timezone.utc:
                now = require_aware(now, "the store clock's time")
            at = format_precise(now)
            seq, previous = data.head
            line, digest = draft.place(seq + 1, previous)
            # nothing below can fail: the write is whole or absent
            row = row.copy()
            row.update(state="committed", lease_expires_at=None, result_json=result_json,
                       updated_at=at, result_exact=exact)  # fmt: skip
            data.effects[effect_key] = row
            ids = None
            if return_events:
                ids = self._append(rows)
            else:
                data.events.extend(rows)  # an event's id is its position: nothing to read back
            data.receipts[draft.receipt_id] = dict(zip(codec.RECEIPT_ROW, (
                draft.receipt_id, action_id, effect_key, draft.result, line,
                draft.finished_at, seq + 1, previous, digest, draft.approval_id,
            )))  # fmt: skip
            data.head = (seq + 1, digest)
            return tuple(map(event_from_row, rows, ids)) if ids is not None else (), draft

    def _append(self, rows: Sequence[EventRow]) -> range:
        events = self._data.events
        first = len(events) + 1
        events.extend(rows)
        return range(first, first + len(rows))
