"""The ``StateStore`` protocol: what ``Control``, the approval providers and the CLI call.

Nothing else is in it, so a backend (or a test double) needs only these methods. Every ctrlrun
store also has the rest of the store API (the single effect transitions, the approval finders,
``events``, ``put_receipt``, ``transactions``) from their shared implementation, ``StoreOps``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from ..authority.ledger import Charge, Consumption, DelegationRecord
from ..action import Action
from ..approvals.records import Approval, ApprovalRecord, ApprovalRequest, VerifiedApprover
from ..effects.records import EffectRecord, EffectState, Reservation
from ..evidence.drafts import EventRow, ReceiptDraft
from ..evidence.receipt import Event, Receipt, UnreadableReceipt

__all__ = ["StateStore"]


@runtime_checkable
class StateStore(Protocol):
    """Effects, approvals, events and the receipt chain; each write decides and writes at once.

    Who calls what: ``Control`` runs a call through ``start_attempt``, ``finish_attempt`` and
    ``record``, and reads ``get_approval`` and ``get_effect``; an approved call without an effect
    key spends its approval with ``consume_approval``, a reconcile hook settles an effect with
    ``resolve_effect``, and an attempt refused by its ceiling is released with ``fail_effect``. The approval providers ask and answer with ``put_approval_request``,
    ``get_approval``, ``grant_approval`` and ``deny_approval``. The operator commands list
    a page at a time (``pending_approvals``, ``iter_effects``, ``iter_receipts``,
    ``last_receipts``, ``iter_receipts_since``; ``receipts`` and ``chain_head`` to verify the
    chain), look one story up by index for ``inspect`` (``receipts_for``, ``events_for``),
    answer and resolve (each answer writing its event in its own transaction, ``events=``), and
    ``close`` the store. Authority keeps its delegations here (``put_delegation``,
    ``get_delegation``, ``delegations``, ``delegations_for``, ``revoke_delegation``), charges
    budgets with the reservation (``start_attempt(charges=...)``) and reads the ledger back
    (``consumptions``).
    """

    # effects
    def consume_approval(self, approval_id: str, action_hash: str) -> Approval: ...

    def resolve_effect(
        self, effect_key: str, state: EffectState | str, resolver: str, *,
        events: Callable[[EffectRecord, datetime], Sequence[Event]] | None = None,
    ) -> EffectRecord: ...

    def fail_effect(self, effect_key: str, action_id: str, error: str | None) -> None:
        """Move this attempt's record to ``failed`` (releasing its budget charges)."""
        ...

    def mark_ambiguous(self, effect_key: str, action_id: str, error: str | None) -> None:
        """Move the record ``action_id`` holds to ``ambiguous`` (an execution whose lease lapsed)."""
        ...

    def get_effect(self, effect_key: str) -> EffectRecord | None: ...

    def iter_effects(
        self, state: EffectState | str | None = None, key_prefix: str | None = None,
        limit: int | None = None, *, page: int = ...,
    ) -> Iterator[EffectRecord]:  # fmt: skip
        """Effect records in creation order, a page at a time (``key_prefix`` literal)."""
        ...

    # approvals
    def put_approval_request(self, request: ApprovalRequest) -> None: ...

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def grant_approval(
        self,
        approval_id: str,
        approver: str,
        *,
        verified: VerifiedApprover | None = None,
        edited_action: Action | None = None,
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> Approval | None: ...

    def deny_approval(
        self, approval_id: str, approver: str, *, verified: VerifiedApprover | None = None,
        events: Callable[[ApprovalRecord, datetime], Sequence[Event]] | None = None,
    ) -> None: ...

    def pending_approvals(self, limit: int | None = None) -> tuple[ApprovalRecord, ...]: ...

    # evidence
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

    # combined operations: one transaction each
    def start_attempt(
        self,
        *,
        action_id: str,
        effect_key: str | None,
        lease: timedelta = ...,
        approval_id: str | None = None,
        action_hash: str | None = None,
        events: Callable[[Approval | None, Reservation | None], Sequence[Event | EventRow]]
        | None = None,
        return_events: bool = True,
        charges: Sequence[Charge] = (),
    ) -> tuple[Approval | None, Reservation | None, tuple[Event, ...]]:
        """Consume the presented approval, reserve the key into ``executing``, take the
        charges, append the events.

        Refusals raise as ``consume_approval_and_reserve`` does and write nothing but its two kept
        writes; ``events`` is called inside the transaction (maybe twice, when the store has to
        plan the start anew) and must not call the store; it may answer ``Event`` objects or
        rows (``EventRow``). The stored events are handed back unless ``return_events`` is
        False (then ``()``: no id is read back, no object made).

        ``charges`` (they need an effect key) are checked only once the reservation table
        granted the key, each against the un-released ledger rows of its grant and metric
        within its window by the store's clock; the first that does not fit raises
        ``BudgetExhausted`` and nothing is written (the approval stays granted). Else their
        rows are written with the reservation, held by its attempt.
        """
        ...

    def finish_attempt(
        self,
        *,
        effect_key: str | None,
        action_id: str,
        outcome: EffectState | str | None,
        result: Any = None,
        error: str | None = None,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Write the outcome, events and receipt together; a refused outcome writes nothing. The
        stored events are handed back unless ``return_events`` is False (then ``()``); a
        ``ReceiptDraft`` comes back placed."""
        ...

    def record(
        self,
        *,
        events: Sequence[Event | EventRow] = (),
        receipt: Receipt | ReceiptDraft | None = None,
        return_events: bool = True,
    ) -> tuple[tuple[Event, ...], Receipt | ReceiptDraft | None]:
        """Append events and chain a receipt in one transaction."""
        ...

    # authority: delegation records and the budget ledger
    def put_delegation(
        self, record: DelegationRecord, *, events: Sequence[Event] = ()
    ) -> tuple[Event, ...]:
        """Insert a delegation with its events (handed back stored); a taken id is
        ``InvalidArgument``."""
        ...

    def get_delegation(self, delegation_id: str) -> DelegationRecord | None: ...

    def delegations(self, *, include_revoked: bool = False) -> tuple[DelegationRecord, ...]:
        """In creation order (``created_at``, then id)."""
        ...

    def delegations_for(self, parent_id: str) -> tuple[DelegationRecord, ...]:
        """The delegations made directly under ``parent_id``, revoked ones too."""
        ...

    def revoke_delegation(
        self,
        delegation_id: str,
        *,
        by: str,
        at: datetime,
        events: Callable[[DelegationRecord], Sequence[Event]] | None = None,
    ) -> bool:
        """Compare-and-set on not revoked, with ``events(revoked record)`` in its transaction;
        False (nothing written) if it was revoked already, ``InvalidArgument`` if unknown."""
        ...

    def consumptions(
        self,
        *,
        grant_id: str | None = None,
        metric: str | None = None,
        since: datetime | None = None,
        effect_key: str | None = None,
    ) -> tuple[Consumption, ...]:
        """Ledger rows (released ones too), in insertion order."""
        ...

    def close(self) -> None: ...
