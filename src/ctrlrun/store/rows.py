"""The row interface a backend supplies (``Tx``), and the combined steps written with it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from ..authority.ledger import Consumption, DelegationRecord
from ..approvals.records import ApprovalRecord, ApprovalStatus
from ..effects.records import EffectRecord, EffectState
from ..errors import CTRLRunError
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt, UnreadableReceipt

__all__ = ["KeptWrite", "Tx", "TxSteps"]


class KeptWrite(Exception):
    """Raised inside a write: commit what was written so far, then raise ``error``."""

    def __init__(self, error: CTRLRunError) -> None:
        super().__init__(str(error))
        self.error = error


class Tx(Protocol):
    """The row operations a backend offers inside one transaction (or lock)."""

    returning: bool  # see TxSteps
    places_receipts: bool  # whether finish_and_place is offered

    def effect(self, effect_key: str) -> EffectRecord | None: ...
    def insert_effect(self, record: EffectRecord) -> bool: ...
    def update_effect(self, expected: EffectRecord, record: EffectRecord) -> bool: ...
    def approval(self, approval_id: str) -> ApprovalRecord | None: ...
    def insert_approval(self, record: ApprovalRecord) -> bool: ...
    def update_approval(self, expected: ApprovalRecord, record: ApprovalRecord) -> bool: ...
    def find_approvals(
        self,
        *,
        action_hash: str | None = None,
        status: ApprovalStatus | None = None,
        valid_at: datetime | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ApprovalRecord]: ...
    def finish_effect(self, expected: EffectRecord, record: EffectRecord) -> bool:
        """Compare-and-set on what a finishing caller knows: ``expected``'s key, action id and
        state, and no result or error stored yet; write ``record``'s state, ``updated_at``,
        lease, result and error (nothing else)."""
        ...

    def insert_events(self, rows: Sequence[EventRow]) -> Sequence[int]:
        """Append event rows; their new ids, in order (``()`` when ``returning`` is False)."""
        ...

    def list_events(self) -> list[Event]: ...
    def insert_events_and_advance_head(
        self, rows: Sequence[EventRow]
    ) -> tuple[Sequence[int], tuple[int, str] | None]:
        """``insert_events(rows)`` (none is fine) and the chain head moved to its next seq:
        the ids and the new ``(seq, hash of the previous receipt)``, or ``None`` for the head
        when its row is missing."""
        ...

    def place_receipt(self, row: tuple[Any, ...], *, last: bool = False) -> bool:
        """Insert a placed receipt's row (the table's columns, in order) and make its hash the
        chain head's; False, writing neither, when its id is taken. ``last``: nothing follows
        in this transaction, so a backend may commit with this statement (when it answers
        False, nothing of the transaction is kept)."""
        ...

    def list_receipts(self) -> list[Receipt | UnreadableReceipt]: ...
    def stored_receipt(self, receipt_id: str) -> tuple[str, str] | None:
        """The stored line and hash of one receipt, or ``None``."""
        ...

    def head(self) -> tuple[int, str] | None: ...

    # paged and indexed reads (see StoreOps.iter_receipts and friends)
    def receipts_page(
        self, after: int | str, limit: int, *, chained: bool = True
    ) -> list[Receipt | UnreadableReceipt]:
        """``limit`` receipts after seq ``after`` by seq; ``chained=False``: the unchained ones
        (no seq) after receipt id ``after`` by id."""
        ...

    def receipts_tail(self, limit: int, *, chained: bool = True) -> list[Receipt | UnreadableReceipt]:
        """The last ``limit`` receipts, newest first (by seq, or the unchained ones by id)."""
        ...

    def receipt_at_or_after(self, seq: int) -> tuple[int, str | None] | None:
        """``(seq, ts)`` of the first receipt with a seq ``>= seq``, or ``None``."""
        ...

    def receipts_by(self, column: str, value: str) -> list[Receipt | UnreadableReceipt]:
        """The receipts whose ``receipt_id``, ``action_id``, ``effect_key`` or ``approval_id``
        is ``value``, in chain order."""
        ...

    def events_by(self, column: str, value: str) -> list[Event]:
        """The events whose ``action_id`` or ``approval_id`` is ``value``, by id."""
        ...

    def effects_page(
        self, state: EffectState | None, low: str | None, high: str | None,
        after: tuple[str, str] | None, limit: int,
    ) -> list[EffectRecord]:  # fmt: skip
        """``limit`` effects in creation order: of ``state``, keys in ``[low, high)``, after
        ``(created_at column text, key)``."""
        ...

    def reserve_new(
        self, record: EffectRecord, rows: Sequence[EventRow], *, last: bool = False
    ) -> Sequence[int] | None:
        """``insert_effect(record)`` and, only if it inserted, ``insert_events(rows)``: their
        ids, or ``None`` (nothing written) when the key has a record. ``last``: nothing follows
        when it inserts, so a backend may commit with this statement (when it does not insert
        it wrote nothing, and later statements run in a new transaction)."""
        ...

    def finish_and_advance(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow]
    ) -> tuple[bool, Sequence[int], tuple[int, str] | None]:
        """``finish_effect(expected, record)`` and ``insert_events_and_advance_head(rows)``,
        whether or not the first matched: its answer, the ids and the new head."""
        ...


    def finish_and_place(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow],
        draft: ReceiptDraft,
    ) -> tuple[Sequence[int], int, str, str] | None:  # fmt: skip
        """The whole finish in one committing step, the receipt placed by the store itself:
        the events' ids and ``(seq, prev_hash, hash)``, or ``None`` (nothing written) when the
        compare-and-set missed. Only where ``places_receipts``. When ``record`` is ``failed``
        the same step releases the key's held charges (as ``release_consumptions``)."""
        ...

    # the budget ledger
    def lock_budgets(self, budgets: Sequence[tuple[str, str]]) -> None:
        """Serialize, until this transaction ends, the writers charging these ``(grant_id,
        metric)`` budgets (sorted), where the transaction alone does not."""
        ...

    def spent(self, windows: Sequence[tuple[str, str, datetime]]) -> list[int]:
        """For each ``(grant_id, metric, since)``: the sum of its un-released rows consumed at
        or after ``since``."""
        ...

    def insert_consumptions(
        self, rows: Sequence[tuple[str, str, int]], effect_key: str, attempt: int, at: datetime
    ) -> None:
        """Append ``(grant_id, metric, amount)`` rows held by this attempt of the key."""
        ...

    def release_consumptions(self, effect_key: str, at: datetime) -> None:
        """Set ``released_at`` on every row of the key not released yet."""
        ...

    def consumptions(
        self, *, grant_id: str | None, metric: str | None, since: datetime | None,
        effect_key: str | None,
    ) -> list[Consumption]:  # fmt: skip
        """The ledger rows matching every filter given, in insertion order."""
        ...

    # delegations
    def delegation(self, delegation_id: str) -> DelegationRecord | None: ...
    def insert_delegation(self, record: DelegationRecord) -> bool:
        """Insert; False (nothing written) when the id is taken."""
        ...

    def list_delegations(
        self, *, include_revoked: bool, parent_id: str | None
    ) -> list[DelegationRecord]:
        """In creation order (``created_at``, then id)."""
        ...

    def revoke_delegation(self, delegation_id: str, by: str, at: datetime) -> bool:
        """Compare-and-set on ``revoked_at IS NULL``: whether this call revoked it."""
        ...


class TxSteps:
    """The combined row operations written with the simple ones; a backend that can do one in
    a single statement overrides it.

    ``returning``: whether event inserts must hand back the stored events (with their ids); when
    False they may answer ``()`` (the caller has no use for them: no event sink).
    """

    returning = True
    places_receipts = False  # see SQLTx.finish_and_place

    def finish_and_place(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow],
        draft: ReceiptDraft,
    ) -> tuple[Sequence[int], int, str, str] | None:  # fmt: skip
        raise NotImplementedError("this store places no receipt itself (places_receipts)")

    def reserve_new(
        self, record: EffectRecord, rows: Sequence[EventRow], *, last: bool = False
    ) -> Sequence[int] | None:
        tx: Any = self
        if not tx.insert_effect(record):
            return None
        return tx.insert_events(rows) if rows else ()

    def finish_and_advance(
        self, expected: EffectRecord, record: EffectRecord, rows: Sequence[EventRow]
    ) -> tuple[bool, Sequence[int], tuple[int, str] | None]:
        tx: Any = self
        finished = tx.finish_effect(expected, record)
        return (finished, *tx.insert_events_and_advance_head(rows))
