"""What the evidence needs of a store: events and the receipt chain (``RecordStore``, part of
every ``StateStore``), and the operator acts chain, holds and prune, the prune checkpoint and
anchor notes (``EvidenceStore``). The memory, SQLite and Postgres stores implement both; a command
that needs the second checks for it by this protocol, never by one method's name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from .acts import Act
from .drafts import EventRow, ReceiptDraft
from .receipt import Event, Receipt, UnreadableReceipt
from .retention import Checkpoint, Hold, PrunePlan, PruneResult

__all__ = ["EvidenceStore", "RecordStore"]


@runtime_checkable
class RecordStore(Protocol):
    """Events and the receipt chain: appended in one transaction, read a page at a time or by
    index, and the chain's head."""

    def receipts(self) -> tuple[Receipt | UnreadableReceipt, ...]:
        """Every receipt in chain order: O(store) (``iter_receipts`` streams)."""
        ...

    def iter_receipts(
        self, after_seq: int = 0, limit: int | None = None, *, page: int = ...
    ) -> Iterator[Receipt | UnreadableReceipt]:
        """Receipts with ``seq > after_seq`` in chain order, a page at a time."""
        ...

    def last_receipts(self, n: int) -> list[Receipt | UnreadableReceipt]:
        """The last ``n`` receipts, in chain order."""
        ...

    def iter_receipts_since(
        self, moment: datetime, *, page: int = ...
    ) -> Iterator[Receipt | UnreadableReceipt]:
        """Receipts finished at or after ``moment``, in chain order."""
        ...

    def receipts_for(
        self, *, receipt_id: str | None = None, action_id: str | None = None,
        effect_key: str | None = None, approval_id: str | None = None,
    ) -> tuple[Receipt | UnreadableReceipt, ...]:  # fmt: skip
        """One receipt by id, or those of one action, effect key or request, by index."""
        ...

    def events_for(
        self, *, action_id: str | None = None, approval_id: str | None = None
    ) -> tuple[Event, ...]:
        """The events of one action or request, by index."""
        ...

    def chain_head(self) -> tuple[int, str] | None: ...

    def record(
        self,
        *,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Append events and chain a receipt in one transaction."""
        ...


@runtime_checkable
class EvidenceStore(Protocol):
    """A store that keeps the operator acts chain, holds, prunes and anchor notes."""

    def receipt_hash_at(self, seq: int) -> str | None: ...
    def prune_checkpoint(self) -> Checkpoint | None: ...
    def acts_head(self) -> tuple[int, str] | None: ...
    def acts_coverage_from(self) -> int | None: ...
    def act_hash_at(self, seq: int) -> str | None: ...
    def iter_acts(self, after: int = 0, *, page: int = ...) -> Iterator[Act]: ...
    def acts_about(self, subject: str) -> tuple[Act, ...]: ...
    def note_anchor(self, kind: str, seq: int, hash: str, token: str, at: str) -> None: ...
    def holds(self) -> tuple[Hold, ...]: ...
    def place_hold(self, hold_id: str, from_seq: int, to_seq: int | None, *, reason: str, by: str) -> Hold: ...
    def release_hold(self, hold_id: str, *, by: str) -> Hold: ...
    def plan_prune(self, through: int, *, older_than: timedelta) -> PrunePlan: ...
    def prune(self, through: int, *, older_than: timedelta, by: str, reason: str, batch: int = ...,
              anchor: Callable[[int, str], Any] | None = None,
              after_batch: Callable[[int], None] | None = None) -> PruneResult: ...  # fmt: skip
